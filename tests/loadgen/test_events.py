"""Stage events reach a sidecar in the order they happened, even when one POST is slow."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from loadgen.runner import _post_event


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

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    async def go() -> None:
        first = asyncio.create_task(_post_event(url, {"event": "stage_end", "stage": "a"}))
        second = asyncio.create_task(
            _post_event(url, {"event": "stage_start", "stage": "b"}, first)
        )
        await asyncio.gather(first, second)

    try:
        asyncio.run(go())
    finally:
        srv.shutdown()
        srv.server_close()
    assert got == ["stage_end", "stage_start"]
