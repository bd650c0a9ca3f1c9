"""Fire N streaming completions at once: the simplest load that makes a small KV cache preempt."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from kvwatch.loadgen.client import served_model, stream_completion
from kvwatch.loadgen.http1 import Http1Pool
from kvwatch.loadgen.records import RequestRecord

__all__ = ["burst_prompts", "run_burst"]

_WORDS = [
    "the",
    "cache",
    "block",
    "token",
    "request",
    "engine",
    "queue",
    "memory",
    "page",
    "stream",
    "model",
    "batch",
]


def burst_prompts(n: int, seed: int = 0, words: int = 24) -> list[str]:
    """Distinct seeded prompts, so prefix caching cannot share their blocks."""
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) for i in range(n)]


async def run_burst(
    base_url: str, n: int, max_tokens: int, seed: int = 0, timeout_s: float = 600.0
) -> list[RequestRecord]:
    """Send `n` completions concurrently, each generating exactly `max_tokens` (ignore_eos)."""
    async with httpx.AsyncClient(timeout=10) as client:
        model = await served_model(client, base_url)
    now = time.perf_counter()
    records = [RequestRecord(request_id=f"burst-{i}", scheduled_at=now) for i in range(n)]
    bodies = [
        {"model": model, "prompt": p, "max_tokens": max_tokens, "ignore_eos": True}
        for p in burst_prompts(n, seed)
    ]
    async with Http1Pool(base_url, read_timeout_s=timeout_s) as pool:
        await asyncio.gather(
            *(stream_completion(pool, b, r) for b, r in zip(bodies, records, strict=True))
        )
    return records
