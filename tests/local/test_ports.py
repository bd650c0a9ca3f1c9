"""Choosing a port for a server kvwatch starts: free_port never hands out a port twice in one
process, though the kernel may offer it again once it is closed (a fleet's replicas and their
sidecars choose side by side)."""

from __future__ import annotations

import socket

import pytest

from kvwatch.local import server as local_server


def test_a_port_handed_out_before_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first = local_server.free_port()
    fresh = next(p for p in range(20000, 65536) if p not in local_server._HANDED)
    offered = iter([first, first, fresh])  # the kernel offers the closed port again, twice
    monkeypatch.setattr(local_server, "_bound_port", lambda host: next(offered))
    assert local_server.free_port() == fresh


def test_a_port_another_process_took_after_the_offer_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:  # what a vLLM starting beside it did with the same offer
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        fresh = next(p for p in range(20000, 65536) if p not in local_server._HANDED)
        offered = iter([busy, fresh])
        monkeypatch.setattr(local_server, "_bound_port", lambda host: next(offered))
        assert local_server.free_port() == fresh
