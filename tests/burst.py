"""Fire N streaming completions at once: the simplest load that makes a small KV cache preempt.
Test and bench code (tests, bench/, scripts/record_release.py), not shipped in the wheel."""

from __future__ import annotations

import asyncio
import math
import random
import time

import httpx

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.send.client import served_model, stream_completion
from kvwatch.loadgen.send.http1 import Http1Pool

__all__ = [
    "THRASH_N", "THRASH_TOKENS", "THRASH_LOADGEN", "burst_prompts", "rate_for_in_flight",
    "run_burst",
]  # fmt: skip

# The live tests' thrashing burst on the shared server (40 blocks of 32 tokens): 32 streams of
# 30-token prompts admitted together at one block each, then each growing to 6 blocks where 39
# hold 6 requests. Measured one after another on a slow machine (2026-12-07, seed 22): 32 x 300
# took 184-189 s with 58-62 preemptions (18-19 repeated), 32 x 150 94 s with 36 (8), 32 x 100
# 67 s with 22 (5). The seven live tests that send it spent most of their time on it.
THRASH_N, THRASH_TOKENS = 32, 150
# the same load through `kvwatch loadgen run` (one stage of THRASH_N at once)
THRASH_LOADGEN = ["--input-len", "30", "--output-len", str(THRASH_TOKENS)]

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


async def rate_for_in_flight(
    base_url: str, in_flight: float, seed: int = 0, max_tokens: int = 300
) -> tuple[float, float]:
    """A request rate that keeps `in_flight` requests of `max_tokens` running on average, by
    Little's law with the time they take at that concurrency (ceil(in_flight) of them sent at
    once): (rate, seconds they took). The live tests and the forecast bench pace their steady
    loads so. A fixed rate was idle on a fast machine and ran the cache out on a slow one; a
    share of the rate at 4 in flight kept one request running where the server is compute
    bound (a request alone takes a third of the time four take together)."""
    if not 0 < in_flight <= 64:
        raise ValueError(f"in_flight must be in (0, 64], got {in_flight}")
    n = math.ceil(in_flight)
    probe = await run_burst(base_url, n=n, max_tokens=max_tokens, seed=seed)
    failed = [r.error for r in probe if not r.ok]
    if failed:
        raise RuntimeError(f"the probe's requests failed: {failed}")
    took = max(r.e2e or 0.0 for r in probe)
    return in_flight / took, took
