"""A small HTTP/1.0-style server for the sidecar's endpoint that keeps answering scrapes while
someone holds thousands of connections open.

A thread per connection (or a pool of threads that each wait for a request to arrive) is held by
a client that connects and sends nothing: with enough such clients no thread is left for
Prometheus. Here one event loop reads every request head, a connection costs a few kilobytes
until its request has arrived, and only a whole request reaches `respond` (in a small thread
pool, so building `/metrics` never stalls the reading). Connections are bounded: past
`max_open`, the oldest connection still sending its request is closed to make room (a client
that has not finished its request in the time thousands of others connected is the one to go),
and a request head must arrive within `head_timeout_s`, shorter than any scrape interval.
Each answer closes its connection.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["Request", "Response", "EndpointServer", "parse_head"]

log = logging.getLogger("kvwatch.http")

_HEAD_LIMIT = 16 * 1024  # request line and headers
_BODY_LIMIT = 64 * 1024
_MAX_HEADERS = 100
_LOG_EVERY_S = 60.0
_ACCEPT_BATCH = 32
_REASONS = {
    200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
    413: "Content Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
}  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One request as read off the wire: header names lower-cased."""

    method: str
    path: str  # without the query
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain"


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path and headers of a request head (up to and including the blank line).
    Raises _BadRequest on anything malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # latin-1 decodes every byte; kept for clarity
        raise _BadRequest(400, "the request head is not text") from e
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise _BadRequest(400, "a request line is METHOD /path HTTP/1.x")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(400, "a header line is Name: value")
        headers[name.lower()] = value.strip()
        if len(headers) > _MAX_HEADERS:
            raise _BadRequest(400, f"more than {_MAX_HEADERS} headers")
    return parts[0], parts[1].split("?", 1)[0], headers


def _wire(r: Response) -> bytes:
    reason = _REASONS.get(r.status, "")
    head = (
        f"HTTP/1.1 {r.status} {reason}\r\nContent-Type: {r.content_type}\r\n"
        f"Content-Length: {len(r.body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + r.body


class EndpointServer:
    """Serves `respond` on (host, port) from a daemon thread until `shutdown()`.

    `shed` counts connections closed unanswered to keep the bound (refused, or evicted while
    still sending their request); `handler_errors` counts `respond` raising, which answers 500
    and says so in the log, once a minute at most."""

    def __init__(
        self,
        host: str,
        port: int,
        respond: Callable[[Request], Response],
        max_open: int = 512,
        head_timeout_s: float = 2.0,
        send_timeout_s: float = 5.0,
        workers: int = 2,
    ) -> None:
        self._respond = respond
        self._max_open = max_open
        self._head_timeout_s = head_timeout_s
        self._send_timeout_s = send_timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvwatch-http")
        self._reading: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self._open = 0
        self._logged_at = -math.inf
        self.shed = 0
        self.handler_errors = 0
        self._loop = asyncio.new_event_loop()
        # asyncio accepts up to `backlog` connections at a time before any of them is read: a
        # small batch lets a scrape's request be read before a flood's later arrivals could
        # evict it. The kernel's queue of handshakes waiting to be accepted stays long.
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(
                self._connection, sock=listener, limit=_HEAD_LIMIT, backlog=_ACCEPT_BATCH
            )
        )
        listener.listen(socket.SOMAXCONN)
        name = listener.getsockname()
        self.server_address: tuple[str, int] = (str(name[0]), int(name[1]))
        self._thread = threading.Thread(target=self._run, name="kvwatch-http", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:  # let every connection's task end (closing its socket) before the loop goes
            tasks = asyncio.all_tasks(self._loop)
            for t in tasks:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Make room for one more connection: evict the oldest still reading, or refuse."""
        if self._open >= self._max_open:
            if not self._reading:
                return False
            oldest = next(iter(self._reading))
            del self._reading[oldest]
            oldest.transport.abort()
            self.shed += 1
        self._open += 1
        self._reading[writer] = None
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            self.shed += 1
            writer.transport.abort()
            return
        try:
            request = await self._read(reader)
            self._reading.pop(writer, None)
            if isinstance(request, Response):  # malformed: say why
                response = request
            else:
                response = await self._loop.run_in_executor(self._pool, self._answer, request)
            writer.write(_wire(response))
            await asyncio.wait_for(writer.drain(), self._send_timeout_s)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client left, reset, was evicted or was too slow: nothing of ours broke
        finally:
            self._reading.pop(writer, None)
            self._open -= 1
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> Request | Response:
        """The whole request (head, then body), or the answer to a malformed one. The
        connection stays evictable until both have arrived."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._head_timeout_s)
        except asyncio.LimitOverrunError:
            return Response(400, f"the request head is over {_HEAD_LIMIT} bytes\n".encode())
        try:
            method, path, headers = parse_head(head)
            if "transfer-encoding" in headers:
                raise _BadRequest(411, "send a Content-Length, not a chunked body")
            raw = headers.get("content-length", "0")
            if not raw.isdigit():
                raise _BadRequest(400, "Content-Length is not a number")
            length = int(raw)
            if length > _BODY_LIMIT:
                raise _BadRequest(413, f"a body is at most {_BODY_LIMIT // 1024} KiB")
        except _BadRequest as e:
            return Response(e.status, f"{e}\n".encode())
        body = await asyncio.wait_for(reader.readexactly(length), self._send_timeout_s)
        return Request(method, path, headers, body)

    def _answer(self, request: Request) -> Response:
        try:
            return self._respond(request)
        except Exception as e:  # a bug of ours: counted and said, and the client told
            self.handler_errors += 1
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._logged_at = now
                log.error(
                    "the HTTP endpoint's handler raised %s: %s (%d so far; "
                    "kvwatch_http_handler_errors_total)",
                    type(e).__name__, str(e)[:200], self.handler_errors,
                )  # fmt: skip
            return Response(500, b"the sidecar's handler failed; its log says why\n")

    def shutdown(self) -> None:
        """Stop accepting and answering; returns once the loop has stopped."""
        if not self._thread.is_alive():
            return

        async def stop() -> None:
            self._server.close()
            for w in list(self._reading):
                w.transport.abort()
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(timeout=5)

    def server_close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
