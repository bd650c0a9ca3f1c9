"""Stage events reach a sidecar in the order they happened, even when one POST is slow."""

from __future__ import annotations

import asyncio
import json
import time
from http.server import BaseHTTPRequestHandler

from kvwatch.loadgen.send.runner import _post_event
from tests.http_server import serving


def test_a_slow_post_is_not_overtaken() -> None:
    got: list[str] = []

    class Slow(BaseHTTPRequestHandler):  # a sidecar that is slow to take the first event
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            ev = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if ev["event"] == "stage_end":
                time.sleep(0.3)
            got.append(ev["event"])
            self.send_response(204)
            self.end_headers()

    async def go(url: str) -> None:
        first = asyncio.create_task(_post_event(url, {"event": "stage_end", "stage": "a"}))
        second = asyncio.create_task(
            _post_event(url, {"event": "stage_start", "stage": "b"}, first)
        )
        await asyncio.gather(first, second)

    with serving(Slow) as url:
        asyncio.run(go(url))
    assert got == ["stage_end", "stage_start"]
