"""A plainly fake OpenAI-style server for what a real vLLM cannot do on demand.

The `model` field of a request picks the misbehaviour: "http500", "http400", "cut" (a stream that
stops mid-way without [DONE]), "malformed" (SSE data that is not JSON); anything else streams a
short normal answer. It counts the completion requests it got.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from tests.http_server import serving

__all__ = ["fake_openai"]


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counter: list[int]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"data": [{"id": "fake-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.counter[0] += 1
        mode = req.get("model")
        if mode in ("http500", "http400"):
            code = int(mode[4:])
            body = b'{"error": "fake ' + mode.encode() + b'"}'
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        if mode == "cut":
            self.wfile.write(_chunk("a") + _chunk("b"))
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "malformed":
            self.wfile.write(_chunk("a") + b"data: {not json\n\n")
            return
        n = int(req.get("max_tokens", 3))
        for i in range(n):
            self.wfile.write(_chunk(f"t{i}"))
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")


@contextmanager
def fake_openai() -> Iterator[tuple[str, list[int]]]:
    counter = [0]
    handler = type("H", (_Handler,), {"counter": counter})
    with serving(handler) as url:
        yield url, counter
