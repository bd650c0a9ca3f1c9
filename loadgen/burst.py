"""Fire N streaming completions at once: the simplest load that makes a small KV cache preempt."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from loadgen.client import served_model, stream_completion
from loadgen.records import RequestRecord

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
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        model = await served_model(client, base_url)
        now = time.perf_counter()
        records = [RequestRecord(request_id=f"burst-{i}", scheduled_at=now) for i in range(n)]
        bodies = [
            {"model": model, "prompt": p, "max_tokens": max_tokens, "ignore_eos": True}
            for p in burst_prompts(n, seed)
        ]
        await asyncio.gather(
            *(
                stream_completion(client, base_url, b, r)
                for b, r in zip(bodies, records, strict=True)
            )
        )
    return records
