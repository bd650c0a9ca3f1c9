"""A webhook receiver that records what it gets (what Slack or a pager would be), on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.http_server import serving

__all__ = ["receiver", "alert_events"]


@contextmanager
def receiver(port: int = 0, delay_s: float = 0.0) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Yields (url, received); each item has `headers` and `body` (parsed JSON). With
    `delay_s`, each answer comes that much later (a slow receiver)."""
    got: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                got.append(
                    {
                        "t": time.time(),
                        "headers": dict(self.headers),
                        "raw": raw,
                        "body": json.loads(raw),
                    }
                )
            time.sleep(delay_s)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler, port) as url:
        yield url + "/hook", got


def alert_events(got: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(when, status, alert name) of each delivery, timed by the sidecar (a firing's start, a
    resolve's end), not by when the receiver got it: on two busy cores a delivery can come
    seconds late."""

    def at(body: dict[str, Any]) -> float:
        stamp = body["ends_at"] if body["status"] == "resolved" else body["starts_at"]
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    return [(at(g["body"]), g["body"]["status"], g["body"]["alertname"]) for g in got]
