"""A lean HTTP/1.1 client for streaming POSTs: the load generator's hot path.

Why not httpx here: starting a request in httpx costs about a millisecond of CPU, and a new
request waits in the event loop behind every stream chunk already queued, so Poisson arrivals
that bunch within a millisecond went out late (dispatch lag p99 2.4-2.9 ms at 100 req/s). Here a
request on a warm keep-alive connection is one `transport.write`, made by the dispatcher itself at
the due time, so a record's `sent_at` is when its bytes left; responses are parsed in the
protocol's `data_received` callback, with no task switch per chunk, and each chunk is stamped
with the time it arrived. A few spare connections are kept open ahead of need.

Plain and TLS (`https`) targets, keep-alive, chunked and Content-Length bodies. No proxies, no
HTTP/2, no redirects: an OpenAI-compatible endpoint needs none. Everything else in kvwatch (and the
load generator's one-off calls) uses httpx.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

__all__ = ["HttpProtocolError", "ResponseParser", "ResponseSink", "Target", "Http1Pool"]

_MAX_HEAD = 64 * 1024


class HttpProtocolError(ValueError):
    """The server's bytes are not a valid HTTP/1.1 response; the message says where."""


class ResponseSink(Protocol):
    """Receives one response as it arrives; `end` is called exactly once."""

    def status(self, code: int) -> None: ...

    def data(self, chunk: bytes, now: float) -> None: ...

    def end(self, error: str | None) -> None: ...


_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    """Incremental HTTP/1.1 response parser: feed bytes as they come, split anywhere.

    Body bytes (de-chunked) go to the sink as they arrive. `done` is set when the message is
    complete; `keep_alive` says whether the connection may carry another request.
    """

    def __init__(self, sink: ResponseSink) -> None:
        self.sink = sink
        self.buf = b""
        self.state = _HEAD
        self.remaining = 0
        self.keep_alive = True

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def feed(self, data: bytes, now: float) -> None:
        """Raises HttpProtocolError on bytes that break HTTP/1.1. Walks the bytes with an
        index (no copy of the rest per chunk: a read holds dozens of a fast stream's chunks)."""
        buf = self.buf + data if self.buf else data
        self.buf = b""
        pos, n, sink = 0, len(buf), self.sink
        while pos < n and self.state != _DONE:
            state = self.state
            if state == _CHUNK_SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > 1024:
                        raise HttpProtocolError("chunk size line over 1 KiB")
                    break
                size_text = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size < 0:
                    raise HttpProtocolError(f"bad chunk size {size_text[:20]!r}")
                pos = end + 2
                if not size:
                    self.state = _TRAILER
                elif pos + size + 2 <= n:  # the whole chunk is here: the common case
                    if buf[pos + size : pos + size + 2] != b"\r\n":
                        raise HttpProtocolError("chunk data not followed by CRLF")
                    sink.data(buf[pos : pos + size], now)
                    pos += size + 2
                else:
                    self.remaining, self.state = size, _CHUNK_DATA
            elif state in (_CHUNK_DATA, _LENGTH):
                take = buf[pos : pos + self.remaining]
                self.remaining -= len(take)
                pos += len(take)
                sink.data(take, now)
                if self.remaining == 0:
                    self.state = _CHUNK_CRLF if state == _CHUNK_DATA else _DONE
            elif state == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HttpProtocolError("chunk data not followed by CRLF")
                self.state = _CHUNK_SIZE
                pos += 2
            elif state == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_HEAD:
                        raise HttpProtocolError("response head over 64 KiB without an end")
                    break
                self._head(buf[pos:end].decode("latin-1"))
                pos = end + 4
            elif state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                if end == pos:
                    self.state = _DONE
                pos = end + 2
            else:  # _UNTIL_CLOSE
                sink.data(buf[pos:], now)
                pos = n
        if pos < n:
            if self.state == _DONE:
                # bytes after a complete response: the connection cannot be trusted with another
                self.keep_alive = False
            else:
                self.buf = buf[pos:]

    def eof(self) -> None:
        """The connection closed: ends a body read until close; anything else is cut short."""
        if self.state == _UNTIL_CLOSE:
            self.state = _DONE
        elif self.state != _DONE:
            raise HttpProtocolError("connection closed before the response was complete")

    def _head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"bad status line {lines[0][:80]!r}")
        code = int(parts[1])
        if 100 <= code < 200:
            return  # an interim response: the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpProtocolError(f"bad header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        self.keep_alive = parts[0] == "HTTP/1.1" and "close" not in conn
        self.sink.status(code)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise HttpProtocolError("bad Content-Length") from None
            self.state = _LENGTH if self.remaining > 0 else _DONE
        elif code in (204, 304):
            self.state = _DONE
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False


@dataclass(frozen=True)
class Target:
    """Where requests go: a base URL split into what a connection and a request line need."""

    scheme: str
    host: str
    port: int
    prefix: str  # path before the endpoint, without a trailing slash

    @classmethod
    def parse(cls, base_url: str) -> Target:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(u.scheme, u.hostname, port, u.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def post_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The whole request, ready to write."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        return head.encode("latin-1") + body


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.alive = True
        self.idle_since = 0.0
        self.last_io = 0.0
        self.was_idle = False  # has waited in the pool: the server may have closed it meanwhile
        self.answered = False  # a byte of the response in progress has come
        self.request = b""
        self.on_sent: Callable[[float], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes, sink: ResponseSink, on_sent: Callable[[float], None]) -> None:
        assert self.transport is not None
        self.parser = ResponseParser(sink)
        self.request, self.on_sent, self.answered = request, on_sent, False
        self.last_io = time.perf_counter()
        on_sent(self.last_io)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        parser = self.parser
        if parser is None:
            self._close()  # bytes nobody asked for
            return
        self.last_io = now
        self.answered = True
        try:
            parser.feed(data, now)
        except HttpProtocolError as e:
            self._finish(f"HttpProtocolError: {e}", reuse=False)
            return
        if parser.done:
            self._finish(None, reuse=parser.keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        parser = self.parser
        if parser is None:
            return
        if self.was_idle and not self.answered and self.pool.resend(self):
            return
        try:
            parser.eof()
        except HttpProtocolError as e:
            why = f"{e} ({type(exc).__name__}: {exc})" if exc else str(e)
            self._finish(f"RemoteProtocolError: {why}", reuse=False)
            return
        self._finish(None, reuse=False)

    def abort(self, error: str) -> None:
        """Give up on the response in progress (a timeout, or a caller that stopped reading)."""
        if self.parser is not None:
            self._finish(error, reuse=False)

    def _finish(self, error: str | None, reuse: bool) -> None:
        parser, self.parser = self.parser, None
        self.pool.busy.discard(self)
        if not reuse:
            self._close()
        else:
            self.pool._release(self)
        assert parser is not None
        parser.sink.end(error)

    def _close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.abort()


class _Waiter:
    """A sink that resolves a future when the response ends, after telling the real sink."""

    __slots__ = ("sink", "future")

    def __init__(self, sink: ResponseSink, future: asyncio.Future[None]) -> None:
        self.sink, self.future = sink, future

    def status(self, code: int) -> None:
        self.sink.status(code)

    def data(self, chunk: bytes, now: float) -> None:
        self.sink.data(chunk, now)

    def end(self, error: str | None) -> None:
        self.sink.end(error)
        if not self.future.done():
            self.future.set_result(None)


class Http1Pool:
    """Keep-alive connections to one target, with `spare` idle ones opened ahead of need.

    `post` writes at once on an idle connection (the bytes have left when it returns) and gives
    a future that is done when the response has ended; errors go to the sink's `end`, never up.
    A response that goes quiet for `read_timeout_s` is aborted. Idle connections are not reused
    after `keepalive_expiry_s` (servers close idle ones: uvicorn after 5 s), and a request whose
    idle connection closes before a byte of answer is sent once more on a new one: the server's
    close and the request crossed, and the failure would be the client's, not the server's.
    """

    def __init__(
        self,
        base_url: str,
        read_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        spare: int = 4,
        keepalive_expiry_s: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.target = Target.parse(base_url)
        self.headers = headers or {}
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.spare = spare
        self.keepalive_expiry_s = keepalive_expiry_s
        self.ssl = ssl_context or (
            ssl.create_default_context() if self.target.scheme == "https" else None
        )
        self.idle: collections.deque[_Connection] = collections.deque()
        self.busy: set[_Connection] = set()
        self.opening = 0
        self.closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Http1Pool:
        self._reaper = asyncio.create_task(self._reap())
        await self.warm(self.spare)  # the first requests find connections open
        return self

    async def warm(self, n: int) -> None:
        """Open connections until `n` are idle (a closed-loop stage about to keep n in flight),
        so no request waits for a connect; one that cannot be opened is left to the requests."""
        await asyncio.gather(*self._openers(n))

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def encode_post(self, path: str, body: bytes, extra: dict[str, str] | None = None) -> bytes:
        """A POST of `body` to `path` under the target, with the pool's headers and `extra`."""
        return self.target.post_bytes(path, body, {**self.headers, **(extra or {})})

    def post(
        self, request: bytes, sink: ResponseSink, on_sent: Callable[[float], None]
    ) -> asyncio.Future[None]:
        """Send `request` (from `encode_post`); `on_sent` gets the time its bytes left."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(sink, future)
        conn = self._take_idle()
        if conn is not None:
            self._send(conn, request, waiter, on_sent)
        else:
            self._spawn(self._connect_and_send(request, waiter, on_sent))
        self.reserve()
        return future

    async def aclose(self) -> None:
        self.closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in list(self.busy):
            conn.abort("client closed before the response ended")
        while self.idle:
            self.idle.pop()._close()

    def _send(
        self,
        conn: _Connection,
        request: bytes,
        sink: ResponseSink,
        on_sent: Callable[[float], None],
    ) -> None:
        self.busy.add(conn)
        conn.send(request, sink, on_sent)

    def _take_idle(self) -> _Connection | None:
        now = time.perf_counter()
        while self.idle:
            conn = self.idle.pop()  # the most recently used: least likely closed by the server
            if conn.alive and now - conn.idle_since < self.keepalive_expiry_s:
                return conn
            conn._close()
        return None

    def _release(self, conn: _Connection) -> None:
        if self.closed or not conn.alive:
            conn._close()
            return
        conn.idle_since = time.perf_counter()
        conn.was_idle = True
        self.idle.append(conn)

    def resend(self, conn: _Connection) -> bool:
        """The server closed an idle connection as the request went out on it, before a byte
        of answer (its keep-alive timer and our send crossed; a client stalled for a second
        stamps the idle start late): send it again once, on a new connection, as browsers do.
        The record's `sent_at` becomes the second send. False: the pool is closing."""
        if self.closed or conn.parser is None or conn.on_sent is None:
            return False
        sink, conn.parser = conn.parser.sink, None
        self.busy.discard(conn)
        self._spawn(self._connect_and_send(conn.request, sink, conn.on_sent, fresh=True))
        return True

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        t = self.target
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Connection(self),
                t.host,
                t.port,
                ssl=self.ssl,
                server_hostname=t.host if self.ssl else None,
            ),
            self.connect_timeout_s,
        )
        return conn

    async def _connect_and_send(
        self,
        request: bytes,
        sink: ResponseSink,
        on_sent: Callable[[float], None],
        fresh: bool = False,
    ) -> None:
        """`fresh`: on a connection opened for this request (a resend), never an idle one."""
        # a spare may have opened while this task waited to run
        conn = None if fresh else self._take_idle()
        if conn is None:
            try:
                conn = await self._open()
            except OSError as e:  # refused, unreachable, timed out, TLS
                reason = str(e) or "timed out"
                sink.end(f"ConnectError: {type(e).__name__}: {reason}")
                return
        self._send(conn, request, sink, on_sent)

    def reserve(self, n: int | None = None) -> None:
        """Start opening connections until `n` (default: `spare`) are idle or opening, without
        waiting: a sender about to wait for a bunch of requests due together gets them open
        meanwhile."""
        for opener in self._openers(self.spare if n is None else n):
            self._spawn(opener)

    def _openers(self, n: int) -> list[Coroutine[Any, Any, None]]:
        """One opener per connection missing for `n` idle, counted in `opening` at once."""
        want = max(0, n - len(self.idle) - self.opening)
        self.opening += want
        return [self._open_spare() for _ in range(want)]

    async def _open_spare(self) -> None:
        """Open one idle connection; `_openers` has counted it in `opening`."""
        try:
            conn = await self._open()
        except OSError:
            return  # the requests themselves will report an unreachable server
        finally:
            self.opening -= 1
        self._release(conn)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap(self) -> None:
        """Abort responses quiet for longer than the read timeout; drop expired idle ones."""
        while True:
            await asyncio.sleep(min(1.0, self.read_timeout_s / 4))
            now = time.perf_counter()
            for conn in list(self.busy):
                if now - conn.last_io > self.read_timeout_s:
                    conn.abort(f"ReadTimeout: no data for {self.read_timeout_s:g} s")
            fresh: collections.deque[_Connection] = collections.deque()
            for c in self.idle:
                if c.alive and now - c.idle_since < self.keepalive_expiry_s:
                    fresh.append(c)
                else:
                    c._close()
            self.idle = fresh
            self.reserve()
