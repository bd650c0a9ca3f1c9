"""Plainly fake servers, for what a real vLLM cannot do on demand (hang, cut a body short), and
a small hand-written vLLM body for parser-level tests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENGINE_LABELS", "raw_http_server", "vllm_body"]

ENGINE_LABELS = 'engine="0",model_name="m"'


@contextmanager
def raw_http_server(reply: bytes | None, port: int = 0, trickle_s: float = 0.0) -> Iterator[str]:
    """Accepts connections and writes `reply` then closes; with None it never answers (hangs).
    With `trickle_s`, the reply's body goes out a byte at a time, that many seconds apart."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            if reply is None:
                held.append(conn)
                continue
            try:
                conn.recv(65536)
                if trickle_s:
                    head, _, body = reply.partition(b"\r\n\r\n")
                    conn.sendall(head + b"\r\n\r\n")
                    for i in range(len(body)):
                        if stop.wait(trickle_s):
                            break
                        conn.sendall(body[i : i + 1])
                else:
                    conn.sendall(reply)
            except OSError:
                pass  # the client gave up
            finally:
                conn.close()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        th.join(2)
        for c in held:
            c.close()
        srv.close()


def vllm_body(**values: object) -> str:
    """A small vLLM /metrics body (text, not a server); each keyword replaces one sample's value."""
    v = {"kv": 0.5, "running": 2, "waiting": 0, "pre": 3, "gen": 100, "blocks": "40"} | values
    return (
        f"vllm:kv_cache_usage_perc{{{ENGINE_LABELS}}} {v['kv']}\n"
        f"vllm:num_requests_running{{{ENGINE_LABELS}}} {v['running']}\n"
        f"vllm:num_requests_waiting{{{ENGINE_LABELS}}} {v['waiting']}\n"
        f"vllm:num_preemptions_total{{{ENGINE_LABELS}}} {v['pre']}\n"
        f"vllm:generation_tokens_total{{{ENGINE_LABELS}}} {v['gen']}\n"
        f'vllm:cache_config_info{{block_size="32",engine="0",num_gpu_blocks="{v["blocks"]}"}} 1\n'
    )
