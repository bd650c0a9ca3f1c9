"""The seed's scenario on a twin: N requests of P prompt tokens decoding together until the KV
cache runs dry. Shared by the live test (tests/twin/test_twin_live.py) and the bench
(bench/bench_twin_seed.py), so the two measure the same way.

Prompts are lists of token ids (exact lengths, no shared prefix). While they run, /metrics is
read every 0.2 s; the blocks in use (KV usage x num_gpu_blocks) against the twin's step counter
during the pure-decode stretch give the new-block demand per step (N / block_size expected).
The twin's log names each preemption's victim and each resumed request's recompute.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["SeedResult", "run_seed", "scrape", "cache_config", "VICTIM_LINE"]

VICTIM_LINE = re.compile(
    r"preempted (\S+) \(admitted #(\d+); the newest running request was admitted #(\d+)\)"
)
_RESUMED = re.compile(
    r"resumed (\S+): (\d+) tokens recomputed in this step, (\d+) found in the prefix cache, "
    r"of its (\d+)"
)


def scrape(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets (one engine here), read with
    prometheus-client's own parser."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def cache_config(text: str) -> dict[str, str]:
    """The labels of vLLM's `cache_config_info` (num_gpu_blocks, block_size, ...)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:cache_config_info":
                return dict(s.labels)
    raise ValueError("the server exports no vllm:cache_config_info")


@dataclass(frozen=True)
class SeedResult:
    requests: int
    prompt_tokens: int
    output_tokens: int
    num_gpu_blocks: int
    block_size: int
    demand_per_step: float | None  # blocks per engine step in the pure-decode stretch
    demand_points: int
    first_preemption_s: float | None  # since the requests were sent (wall)
    first_finish_s: float | None
    finished_at_first_preemption: int | None
    preemptions: int
    first_victim_admitted: int | None
    newest_admitted_then: int | None
    first_recompute_tokens: int | None  # in the one step that resumed it
    first_recompute_cached: int | None  # its blocks still in the prefix cache
    first_recompute_of: int | None
    wall_s: float
    simulated_s: float
    behind_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _one(client: httpx.AsyncClient, model: str, prompt: list[int], out: int) -> float:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": out,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for _ in r.aiter_lines():
            pass
    return time.monotonic()


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


async def run_seed(
    base_url: str,
    model: str,
    log_path: Path,
    requests: int = 100,
    prompt_tokens: int = 1000,
    output_tokens: int = 500,
    seed: int = 0,
) -> SeedResult:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 4000) for _ in range(prompt_tokens)] for _ in range(requests)]
    samples: list[dict[str, float]] = []
    limits = httpx.Limits(max_connections=requests + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        text = (await client.get("/metrics")).text
        first, cc = scrape(text), cache_config(text)
        blocks, block_size = int(cc["num_gpu_blocks"]), int(cc["block_size"])
        start = time.monotonic()
        tasks = []
        for p in prompts:
            tasks.append(asyncio.create_task(_one(client, model, p, output_tokens)))
            await asyncio.sleep(0)  # sent in order: the admission order is the arrival order
        done = False

        async def sample() -> None:
            while not done:
                t = time.monotonic()
                s = scrape((await client.get("/metrics")).text)
                s["_t"] = t - start
                samples.append(s)
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample())
        finishes = await asyncio.gather(*tasks)
        done = True
        await sampler
        last = scrape((await client.get("/metrics")).text)
    wall = time.monotonic() - start
    first_finish = min(finishes) - start
    preempt = "vllm:num_preemptions_total"
    succ = "vllm:request_success_total"
    base_pre = first.get(preempt, 0.0)
    base_succ = first.get(succ, 0.0)
    first_pre = next((s for s in samples if s.get(preempt, 0.0) > base_pre), None)
    # pure decode: everyone running, nobody waiting or preempted, nobody finished
    points = [
        (s["kvwatch_twin_steps_total"], s["vllm:kv_cache_usage_perc"] * blocks)
        for s in samples
        if s.get("vllm:num_requests_running", 0) == requests
        and s.get("vllm:num_requests_waiting", 0) == 0
        and s.get(preempt, 0.0) == base_pre
        and s.get(succ, 0.0) == base_succ
        and s.get("vllm:kv_cache_usage_perc", 0) * blocks >= requests * prompt_tokens / block_size
    ]
    log = log_path.read_text(errors="replace")
    victim = VICTIM_LINE.search(log)
    resumed = _RESUMED.search(log)
    return SeedResult(
        requests=requests,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        num_gpu_blocks=blocks,
        block_size=block_size,
        demand_per_step=_slope(points),
        demand_points=len(points),
        first_preemption_s=None if first_pre is None else first_pre["_t"],
        first_finish_s=first_finish,
        finished_at_first_preemption=None
        if first_pre is None
        else int(first_pre.get(succ, 0.0) - base_succ),
        preemptions=int(last.get(preempt, 0.0) - base_pre),
        first_victim_admitted=int(victim[2]) if victim else None,
        newest_admitted_then=int(victim[3]) if victim else None,
        first_recompute_tokens=int(resumed[2]) if resumed else None,
        first_recompute_cached=int(resumed[3]) if resumed else None,
        first_recompute_of=int(resumed[4]) if resumed else None,
        wall_s=wall,
        simulated_s=last.get("kvwatch_twin_simulated_seconds_total", 0.0)
        - first.get("kvwatch_twin_simulated_seconds_total", 0.0),
        behind_s=last.get("kvwatch_twin_behind_seconds_total", 0.0)
        - first.get("kvwatch_twin_behind_seconds_total", 0.0),
    )
