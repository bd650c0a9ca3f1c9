"""A FAKE OpenAI-compatible streaming server, written to outrun any client (for benchmarks only).

asyncio (uvloop when present) with a hand-rolled HTTP/1.1 keep-alive parser. `/v1/completions`
and `/v1/chat/completions` stream `max_tokens` chunks as fast as the socket takes them (or with
`--token-delay` seconds between them), then usage and [DONE]. `/v1/models` lists one model.

    python bench/fast_server.py --port 8100 [--token-delay 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import subprocess
import sys
import time
from collections.abc import Iterator

_MODEL = "fake-model"


def _chunk(i: int, chat: bool) -> bytes:
    text = f" t{i}"
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


_BATCH = 16  # chunks per write with no --token-delay: one syscall per 16 tokens, not one each


@functools.cache
def _framed(i: int, chat: bool) -> bytes:
    """Token i's chunk in chunked framing, made once: the server must outrun any client."""
    piece = _chunk(i, chat)
    return b"%x\r\n%s\r\n" % (len(piece), piece)


class _Conn(asyncio.Protocol):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.queue: asyncio.Queue[tuple[str, str, bytes]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.task = asyncio.get_running_loop().create_task(self.serve())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            method, path, _ = head.split(" ", 2)
            self.queue.put_nowait((method, path, body))

    async def serve(self) -> None:
        assert self.transport is not None
        t = self.transport
        while True:
            method, path, body = await self.queue.get()
            if method == "GET":
                payload = json.dumps({"data": [{"id": _MODEL, "object": "model"}]}).encode()
                t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))  # fmt: skip
                continue
            if not path.startswith("/v1/"):
                t.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            req = json.loads(body or b"{}")
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
            chat = "chat" in path
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            if self.delay:
                for i in range(n):
                    t.write(_framed(i, chat))
                    await asyncio.sleep(self.delay)
            else:
                for start in range(0, n, _BATCH):
                    end = min(n, start + _BATCH)
                    t.write(b"".join(_framed(i, chat) for i in range(start, end)))
                    await asyncio.sleep(0)
            usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 16,
                     "completion_tokens": n, "total_tokens": n + 16}}  # fmt: skip
            tail = b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"
            t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))


async def _main(port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(delay), "127.0.0.1", port, backlog=4096)
    print(f"fake server on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def serving(core: str | None = None) -> Iterator[str]:
    """Start this server on a free port (pinned to `core` with taskset, if given), wait until it
    answers, and yield its URL; stopped on the way out. For the benchmarks that drive it."""
    import httpx

    from kvwatch.local.server import free_port

    port = free_port()
    pin = ["taskset", "-c", core] if core is not None else []
    cmd = [*pin, sys.executable, __file__, "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(url + "/v1/models")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-delay", type=float, default=0.0)
    ns = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_main(ns.port, ns.token_delay))


if __name__ == "__main__":
    main()
