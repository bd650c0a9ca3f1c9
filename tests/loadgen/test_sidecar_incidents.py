"""What a run keeps of the sidecar's incidents: only known keys, as strings and numbers, from a
FAKE sidecar whose /api/state is hostile or broken (the real sidecar's answer is covered by the
live engine-death test)."""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler

import httpx

from kvwatch.loadgen.results.server_metrics import sidecar_incidents
from tests.http_server import serving


def _serve(body: bytes):  # type: ignore[no-untyped-def]
    class FakeSidecar(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return serving(FakeSidecar)


def _ask(url: str) -> dict:
    async def go() -> dict:
        async with httpx.AsyncClient(timeout=5) as client:
            return await sidecar_incidents(client, url)

    return asyncio.run(go())


def test_known_keys_only_and_long_text_cut() -> None:
    state = {"targets": [{
        "target": "http://v", "engine_status": "dead", "engine_status_reason": "x" * 5000,
        "log": {"incidents": [
            {"what": "engine_death", "at": "12-01 10:00:05", "detail": "d", "cause": None,
             "lines": 3, "secret": "webhook-token"},
            {"what": 7}, "not an object",
        ]},
    }, "junk"]}  # fmt: skip
    with _serve(json.dumps(state).encode()) as url:
        got = _ask(url)
    assert got["engines"] == {"http://v": {"status": "dead", "reason": "x" * 1000}}
    (inc,) = got["incidents"]
    assert inc == {"what": "engine_death", "at": "12-01 10:00:05", "until": None,
                   "detail": "d", "cause": None, "lines": 3}  # fmt: skip


def test_a_broken_answer_is_nothing_not_a_crash() -> None:
    for body in (b"{not json", b'{"targets": 5}', b"[]", b'{"targets": [{"log": 3}]}'):
        with _serve(body) as url:
            got = _ask(url)
        assert got in ({}, {"engines": {}, "incidents": []}), (body, got)
    assert _ask("http://127.0.0.1:9") == {}  # nobody there
