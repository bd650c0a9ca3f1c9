"""Plainly fake servers, for what a real vLLM cannot do on demand (hang, cut a body short)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["raw_http_server"]


@contextmanager
def raw_http_server(reply: bytes | None, port: int = 0) -> Iterator[str]:
    """Accepts connections and writes `reply` then closes; with None it never answers (hangs)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            if reply is None:
                held.append(conn)
                continue
            try:
                conn.recv(65536)
                conn.sendall(reply)
            finally:
                conn.close()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        th.join(2)
        for c in held:
            c.close()
        srv.close()
