"""Choosing a port for a server kvwatch starts: a port handed out to two starts at once (a fleet's
replicas start side by side) and taken by the other first is skipped, not fatal."""

from __future__ import annotations

import socket

import pytest

from kvwatch.loadgen import local_server


def test_a_port_taken_between_choosing_and_checking_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        handed = iter([busy, busy])  # the first two handed out: the one another start took
        real = local_server.free_port
        monkeypatch.setattr(local_server, "free_port", lambda h: next(handed, None) or real(h))
        port = local_server._unused_port("127.0.0.1")
        assert port != busy and local_server.port_is_free(port)
