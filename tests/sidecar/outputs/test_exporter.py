"""The sidecar's own endpoint, in process: what it says when its own code fails."""

from __future__ import annotations

import logging

import httpx
import pytest

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.outputs.exporter import serve
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sidecar.state.views import StateView


def test_a_handler_that_raises_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A broken handler showed only as dropped connections: no log line, no counter. Now it
    answers 500, counts, and says so once a minute."""
    state = SidecarState(["http://127.0.0.1:9"], Thresholds())
    calls = [0]

    def view() -> StateView:
        calls[0] += 1
        if calls[0] <= 2:
            raise KeyError("a bug in a view")
        return state.view(8.0)

    server = serve("127.0.0.1", 0, view, 60.0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with caplog.at_level(logging.ERROR, logger="kvwatch.http"):
            for _ in range(2):
                assert httpx.get(base + "/api/state", timeout=5).status_code == 500
        text = httpx.get(base + "/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    assert "kvwatch_http_handler_errors_total 2.0" in text
    assert "kvwatch_http_connections_shed_total 0.0" in text
    said = [r.getMessage() for r in caplog.records if r.name == "kvwatch.http"]
    assert len(said) == 1 and "raised KeyError" in said[0]  # once a minute, not per request
