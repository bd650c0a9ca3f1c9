"""Serve a `BaseHTTPRequestHandler` on a free port of 127.0.0.1 for the length of a block."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["serving", "ExpositionHandler"]


class ExpositionHandler(BaseHTTPRequestHandler):
    """A FAKE exporter's GET /metrics: Prometheus text that `exposition` (a subclass's) makes
    for each scrape; 404 elsewhere, and no access log."""

    def exposition(self) -> str:
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = self.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], port: int = 0) -> Iterator[str]:
    """Yields the base URL; stops the server and its threads afterwards."""
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
