"""The load generator's HTTP/1.1 client: the parser on any split of the bytes, and the pool's
keep-alive, expiry and timeouts against a small keep-alive SSE server written for the test (the
live tests drive the same code against vLLM's own server)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.send.client import stream_completion
from kvwatch.loadgen.send.http1 import Http1Pool, HttpProtocolError, ResponseParser, Target


class _Sink:
    def __init__(self) -> None:
        self.code = 0
        self.body = b""
        self.ended: list[str | None] = []

    def status(self, code: int) -> None:
        self.code = code

    def data(self, chunk: bytes, now: float) -> None:
        self.body += chunk

    def end(self, error: str | None) -> None:
        self.ended.append(error)


def _chunked(*pieces: bytes) -> bytes:
    out = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for p in pieces:
        out += b"%x;ext=1\r\n%s\r\n" % (len(p), p)
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


def _feed_split(raw: bytes, cuts: list[int]) -> tuple[ResponseParser, _Sink]:
    sink = _Sink()
    parser = ResponseParser(sink)
    last = 0
    for c in sorted(set(cuts)) + [len(raw)]:
        parser.feed(raw[last:c], 0.0)
        last = c
    return parser, sink


class TestParser:
    @settings(deadline=None)  # timing belongs in bench/, not here: a busy machine is slow
    @given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), st.data())
    def test_chunked_body_is_the_same_however_split(self, pieces: list[bytes], data) -> None:
        raw = _chunked(*pieces)
        cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
        parser, sink = _feed_split(raw, cuts)
        assert parser.done and parser.keep_alive and sink.code == 200
        assert sink.body == b"".join(pieces)

    @settings(deadline=None)
    @given(st.binary(max_size=200), st.data())
    def test_content_length_body(self, body: bytes, data) -> None:
        raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        parser, sink = _feed_split(raw, data.draw(st.lists(st.integers(0, len(raw)))))
        assert parser.done and sink.code == 400 and sink.body == body

    def test_interim_response_is_skipped(self) -> None:
        parser, sink = _feed_split(b"HTTP/1.1 100 Continue\r\n\r\n" + _chunked(b"x"), [])
        assert parser.done and sink.code == 200 and sink.body == b"x"

    def test_body_until_close(self) -> None:
        parser, sink = _feed_split(b"HTTP/1.1 200 OK\r\n\r\nabc", [])
        assert not parser.done and not parser.keep_alive
        parser.eof()
        assert parser.done and sink.body == b"abc"

    @pytest.mark.parametrize(
        ("head", "keep"),
        [
            (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
            (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nextra", False),
        ],
    )
    def test_keep_alive(self, head: bytes, keep: bool) -> None:
        parser, _ = _feed_split(head, [])
        assert parser.done and parser.keep_alive is keep

    @pytest.mark.parametrize(
        ("raw", "why"),
        [
            (b"SPAM 200 OK\r\n\r\n", "bad status line"),
            (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", "CRLF"),
            (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000, "64 KiB"),
        ],
    )
    def test_broken_responses_are_named(self, raw: bytes, why: str) -> None:
        with pytest.raises(HttpProtocolError, match=why):
            _feed_split(raw, [])

    def test_cut_short(self) -> None:
        parser, _ = _feed_split(_chunked(b"abc")[:-10], [])
        with pytest.raises(HttpProtocolError, match="closed before"):
            parser.eof()


class TestTarget:
    def test_request_bytes(self) -> None:
        t = Target.parse("https://api.example.com/prefix/")
        raw = t.post_bytes("/v1/completions", b"{}", {"Authorization": "Bearer k"})
        assert raw.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\nHost: api.example.com\r\n")
        assert b"Content-Length: 2\r\nAuthorization: Bearer k\r\n\r\n{}" in raw
        assert Target.parse("http://[::1]:8000").host_header == "[::1]:8000"

    def test_not_http(self) -> None:
        with pytest.raises(ValueError, match="not an http"):
            Target.parse("ftp://x")


@asynccontextmanager
async def _sse_server(
    close_after_response: bool = False,
    answer: bool = True,
    tls: ssl.SSLContext | None = None,
    answers_per_connection: int | None = None,
    requests: list[int] | None = None,
) -> AsyncIterator[tuple[str, list[int]]]:
    """A FAKE keep-alive server that streams `max_tokens` SSE chunks; counts its connections
    (and the requests it read, into `requests`). After `answers_per_connection` answers on a
    connection it closes it on the next request, unanswered: a keep-alive close that crossed
    the request, which a real server does only by chance."""
    conns = [0]
    got = requests if requests is not None else [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns[0] += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                req = json.loads(await reader.readexactly(length))
                got[0] += 1
                if answers_per_connection is not None and answered >= answers_per_connection:
                    break
                answered += 1
                if not answer:
                    await asyncio.sleep(3600)
                pieces = [
                    b"data: " + json.dumps({"choices": [{"text": f"t{i}"}]}).encode() + b"\n\n"
                    for i in range(req["max_tokens"])
                ]
                usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
                pieces.append(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                raw = _chunked(*pieces)
                for i in range(0, len(raw), 7):  # dribble: responses arrive split anywhere
                    writer.write(raw[i : i + 7])
                await writer.drain()
                if close_after_response:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # the loop is closing with this connection idle; ending cancelled makes Python 3.11's
            # stream callback log a spurious "Exception in callback"
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", conns


async def _post(pool: Http1Pool, n: int = 4) -> RequestRecord:
    rec = RequestRecord("r", time.perf_counter())
    return await stream_completion(pool, {"model": "m", "prompt": "x", "max_tokens": n}, rec)


class TestPool:
    def test_keep_alive_reuses_connections(self) -> None:
        async def go() -> None:
            async with _sse_server() as (url, conns), Http1Pool(url, spare=2) as pool:
                for _ in range(20):
                    r = await _post(pool)
                    assert r.ok, r.error
                    assert len(r.token_times) == 4 and r.output_tokens == 4
                    assert r.sent_at is not None and r.sent_at <= r.first_token_at
                assert conns[0] <= 3

        asyncio.run(go())

    def test_warm_opens_connections_ahead(self) -> None:
        async def go() -> None:
            async with _sse_server() as (url, conns), Http1Pool(url, spare=1) as pool:
                await pool.warm(6)
                await asyncio.sleep(0.05)  # the server has accepted them all
                assert len(pool.idle) == 6 and conns[0] == 6
                records = await asyncio.gather(*(_post(pool) for _ in range(6)))
                assert all(r.ok for r in records) and conns[0] <= 7

        asyncio.run(go())

    def test_sent_when_post_returns_on_a_warm_connection(self) -> None:
        async def go() -> None:
            async with _sse_server() as (url, _), Http1Pool(url) as pool:
                sent: list[float] = []
                fut = pool.post(pool.encode_post("/v1/completions", b"{}"), _Sink(), sent.append)
                assert sent and sent[0] <= time.perf_counter()
                fut.cancel()

        asyncio.run(go())

    def test_server_closing_or_expiry_never_fails_the_next_request(self) -> None:
        async def go() -> None:
            async with _sse_server(close_after_response=True) as (url, conns):
                async with Http1Pool(url, spare=1) as pool:
                    for _ in range(5):
                        assert (await _post(pool)).ok
                        await asyncio.sleep(0.05)  # the close reaches the client
                assert conns[0] >= 5
            async with _sse_server() as (url, conns):
                async with Http1Pool(url, spare=1, keepalive_expiry_s=0.01) as pool:
                    for _ in range(3):
                        assert (await _post(pool)).ok
                        await asyncio.sleep(0.05)
                assert conns[0] >= 3

        asyncio.run(go())

    def test_an_idle_connection_closed_as_the_request_went_is_sent_again_once(self) -> None:
        async def go(answers: int) -> tuple[list[RequestRecord], int]:
            requests = [0]
            async with (
                _sse_server(answers_per_connection=answers, requests=requests) as (url, _),
                Http1Pool(url, spare=1) as pool,
            ):
                records = []
                for _ in range(4):
                    records.append(await _post(pool))
                    await asyncio.sleep(0.02)
            return records, requests[0]

        # each connection answers once: every request after the first finds its idle
        # connection closed unanswered, and goes again on a new one, where it is answered
        records, requests = asyncio.run(go(1))
        assert all(r.ok for r in records), [r.error for r in records]
        assert all(r.output_tokens == 4 for r in records)
        assert requests <= 2 * len(records)
        # a server that never answers: the resend is tried once, then the record says so
        records, requests = asyncio.run(go(0))
        assert not any(r.ok for r in records)
        assert all("closed before the response was complete" in str(r.error) for r in records)
        assert requests == 2 * len(records)  # one resend each, never a loop

    def test_read_timeout_is_a_record(self) -> None:
        async def go() -> RequestRecord:
            async with (
                _sse_server(answer=False) as (url, _),
                Http1Pool(url, read_timeout_s=0.3) as pool,
            ):
                return await _post(pool)

        r = asyncio.run(go())
        assert not r.ok and "ReadTimeout" in str(r.error) and r.finished_at is not None


def _self_signed(tmp: Path) -> Path:
    """A certificate for 127.0.0.1 (key and certificate in one PEM file)."""
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    both = tmp / "both.pem"
    both.write_bytes(key.read_bytes() + cert.read_bytes())
    return both


def test_tls_target_verified(tmp_path: Path) -> None:
    pem = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pem)

    async def go(trust: bool) -> RequestRecord:
        client_ctx = ssl.create_default_context(cafile=str(pem)) if trust else None
        async with (
            _sse_server(tls=server_ctx) as (url, _),
            Http1Pool(url, ssl_context=client_ctx) as pool,
        ):
            assert url.startswith("https://")
            return await _post(pool)

    r = asyncio.run(go(trust=True))
    assert r.ok and len(r.token_times) == 4, r.error
    # the system trust store does not know the test certificate: a clear error, not a crash
    r = asyncio.run(go(trust=False))
    assert (
        not r.ok and "ConnectError" in str(r.error) and "CERTIFICATE_VERIFY_FAILED" in str(r.error)
    )


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"data: {not json\n\n", "malformed SSE data"),
        (b"data: [1, 2]\n\n", "not a completion chunk"),
        (b'data: {"choices": [7]}\n\n', "not a completion chunk"),
        (b'data: {"choices": [], "usage": 3}\n\n', "not a completion chunk"),
        (b'data: {"error": {"message": "boom"}}\n\n', "server error in stream"),
    ],
)
def test_odd_sse_data_is_a_record_error(data: bytes, why: str) -> None:
    from kvwatch.loadgen.send.client import _StreamRecorder

    rec = RequestRecord("r", 0.0)
    sink = _StreamRecorder(rec)
    sink.status(200)
    sink.data(b'data: {"choices": [{"text": "a"}]}\n\n' + data, 1.0)
    sink.end(None)
    assert len(rec.token_times) == 1 and why in str(rec.error)


def test_which_sse_chunks_are_tokens() -> None:
    """What counts as a token, read by the typed chunk decoder: text "" is one (a token that
    ends mid-way through a UTF-8 character), null is none; chat's role-only delta is none."""
    from kvwatch.loadgen.send.client import _StreamRecorder

    rec = RequestRecord("r", 0.0)
    sink = _StreamRecorder(rec)
    sink.status(200)
    events = [
        b'{"choices": [{"text": "a"}]}',
        b'{"choices": [{"text": ""}]}',
        b'{"choices": [{"text": null, "finish_reason": "stop"}]}',
        b'{"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
        b'{"choices": [{"delta": {"content": "b"}}], "extra": {"nested": [1, 2]}}',
        b'{"choices": [{"delta": {}}]}',
        b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}',
    ]
    sink.data(b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n", 1.0)
    sink.end(None)
    assert rec.error is None and len(rec.token_times) == 3
    assert (rec.prompt_tokens, rec.output_tokens) == (5, 3)
    bad = RequestRecord("r", 0.0)
    sink = _StreamRecorder(bad)
    sink.status(200)
    sink.data(b'data: {"choices": [], "usage": {"prompt_tokens": "5"}}\n\n', 1.0)
    assert "not a completion chunk" in str(bad.error)
