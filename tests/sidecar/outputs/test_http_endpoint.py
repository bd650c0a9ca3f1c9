"""The sidecar's HTTP server in process: it reads whole requests before any handler runs, keeps
its connections bounded by evicting the oldest still sending, and says what it refuses."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from kvwatch.sidecar.outputs.http_endpoint import (
    EndpointServer,
    Request,
    Response,
    _BadRequest,
    parse_head,
)


def _echo(req: Request) -> Response:
    if req.path == "/boom":
        raise RuntimeError("a bug")
    return Response(200, f"{req.method} {req.path} {len(req.body)}".encode())


@contextmanager
def _server(**kw: float) -> Iterator[tuple[EndpointServer, str]]:
    srv = EndpointServer("127.0.0.1", 0, _echo, **kw)  # type: ignore[arg-type]
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_head_is_parsed_or_refused_with_a_reason() -> None:
    method, path, headers = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nX-Y:  z \r\n\r\n")
    assert (method, path, headers) == ("GET", "/metrics", {"host": "a", "x-y": "z"})
    many = b"".join(b"h%d: v\r\n" % i for i in range(101))
    for bad in (b"GET /metrics\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"G3T / HTTP/1.1\r\n\r\n",
                b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"GET / HTTP/1.1\r\n : x\r\n\r\n",
                b"GET / HTTP/1.1\r\n" + many + b"\r\n"):  # fmt: skip
        with pytest.raises(_BadRequest):
            parse_head(bad)


def test_malformed_requests_get_an_answer_that_says_why() -> None:
    with _server() as (srv, base):
        port = srv.server_address[1]
        assert _raw(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert _raw(port, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.1 400 "
        )
        big = b"POST /e HTTP/1.1\r\nContent-Length: 100000\r\n\r\n"
        assert _raw(port, big).startswith(b"HTTP/1.1 413 ")
        chunked = b"POST /e HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert _raw(port, chunked).startswith(b"HTTP/1.1 411 ")
        assert _raw(port, b"POST /e HTTP/1.1\r\nContent-Length: x\r\n\r\n").startswith(
            b"HTTP/1.1 400 "
        )
        r = httpx.post(base + "/e", content=b"12345", timeout=5)
        assert (r.status_code, r.text) == (200, "POST /e 5")
        assert srv.shed == 0 and srv.handler_errors == 0


def test_a_handler_that_raises_answers_500_and_is_counted() -> None:
    with _server() as (srv, base):
        assert httpx.get(base + "/boom", timeout=5).status_code == 500
        assert httpx.get(base + "/ok", timeout=5).status_code == 200
        assert srv.handler_errors == 1


def test_held_connections_never_keep_a_scrape_waiting() -> None:
    """More half-sent requests held open than the bound: the oldest are evicted, a scrape on a
    fresh connection is answered at once, and every eviction is counted."""
    with _server(max_open=8) as (srv, base):
        port = srv.server_address[1]
        held = []
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request
            held.append(s)
        try:
            t0 = time.monotonic()
            assert httpx.get(base + "/metrics", timeout=2).status_code == 200
            assert time.monotonic() - t0 < 1.0
            assert srv.shed >= 40 - 8
        finally:
            for s in held:
                s.close()


def test_a_client_that_sends_nothing_is_dropped_after_the_head_timeout() -> None:
    with _server(head_timeout_s=0.3) as (srv, _):
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=5)
        t0 = time.monotonic()
        try:
            assert s.recv(100) == b""  # closed by the server, unanswered
        finally:
            s.close()
        assert 0.2 < time.monotonic() - t0 < 3.0
