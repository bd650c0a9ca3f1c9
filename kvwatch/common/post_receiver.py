"""A loopback HTTP server, in a thread, that takes POSTed bodies: the base of the demo's webhook
receiver and the fleet lab's Alertmanager receiver. It answers 200 once the subclass's `take`
has the body (what a body means is `take`'s)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

__all__ = ["PostReceiver"]


class PostReceiver:
    """Start it with `with`; `base` is its http://127.0.0.1:PORT (a free port)."""

    def __init__(self) -> None:
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                me.take(self.path, body)  # before the answer: a sender that got 200 is kept
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        # a short poll: closing waits for it (0.5 s by default, each time a receiver stops)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def take(self, path: str, body: bytes) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and free the port; safe twice, and for one never entered (its socket
        is bound when it is made)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
