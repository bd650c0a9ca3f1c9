"""Plainly fake servers, for what a real vLLM cannot do on demand (hang, cut a body short)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["raw_http_server"]


@contextmanager
def raw_http_server(reply: bytes | None, port: int = 0, trickle_s: float = 0.0) -> Iterator[str]:
    """Accepts connections and writes `reply` then closes; with None it never answers (hangs).
    With `trickle_s`, the reply's body goes out a byte at a time, that many seconds apart."""
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
                if trickle_s:
                    head, _, body = reply.partition(b"\r\n\r\n")
                    conn.sendall(head + b"\r\n\r\n")
                    for i in range(len(body)):
                        if stop.wait(trickle_s):
                            break
                        conn.sendall(body[i : i + 1])
                else:
                    conn.sendall(reply)
            except OSError:
                pass  # the client gave up
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
