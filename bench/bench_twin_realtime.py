"""How many concurrent streams the twin keeps in real time on this machine.

Starts the twin at time scale 1, holds C closed-loop streams (PROMPT prompt + OUTPUT output
tokens) for a while at each C, and reads the twin's own counters: the share of wall time the
simulated card sat idle while running requests waited on this machine's CPU
(`kvwatch_twin_behind_*`), the tokens generated per wall second, and how many requests vLLM
had running and waiting on average (sampled once a second). Real time holds at C while the
card waits on the CPU under 10% of the time; `in_flight` (running + waiting) below C shows the
client or the API server not keeping C requests in flight, and waiting shows the card itself
saturated (requests queue for it, as on a real card).
Writes bench/results/twin/realtime.json; docs/twin.md has the table.

    PYTHONPATH=. .venv/bin/python bench/bench_twin_realtime.py [--levels 64,128,256,512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import httpx

from kvwatch.twin.serve import start_twin
from tests.twin.seed import scrape

OUT = Path(__file__).parent / "results" / "twin" / "realtime.json"
PRESETS = {"llama-3.1-8b": "h100", "gpt-oss-120b": "h200"}


PROMPT, OUTPUT = 1000, 300


async def _level(url: str, model: str, streams: int, seconds: float) -> dict[str, object]:
    rng = random.Random(streams)
    running: list[float] = []
    waiting: list[float] = []
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def stream() -> None:
            while time.monotonic() < stop:
                body = {
                    "model": model,
                    "prompt": [rng.randrange(3, 4000) for _ in range(PROMPT)],
                    "max_tokens": OUTPUT,
                    "ignore_eos": True,
                    "stream": True,
                }
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        pass

        async def watch() -> None:
            await asyncio.sleep(5)  # past the first prefills
            while time.monotonic() < stop:
                m = scrape((await client.get("/metrics")).text)
                running.append(m.get("vllm:num_requests_running", 0.0))
                waiting.append(m.get("vllm:num_requests_waiting", 0.0))
                await asyncio.sleep(1)

        before = scrape((await client.get("/metrics")).text)
        t0 = time.monotonic()
        await asyncio.gather(watch(), *(stream() for _ in range(streams)))
        wall = time.monotonic() - t0
        after = scrape((await client.get("/metrics")).text)

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    return {
        "streams": streams,
        "wall_s": wall,
        "tokens_per_s": d("vllm:generation_tokens_total") / wall,
        "behind_share": d("kvwatch_twin_behind_seconds_total") / wall,
        "busy_share": d("kvwatch_twin_simulated_seconds_total") / wall,
        "mean_running": sum(running) / len(running) if running else 0.0,
        "mean_waiting": sum(waiting) / len(waiting) if waiting else 0.0,
        "held": d("kvwatch_twin_behind_seconds_total") / wall < 0.10,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="64,128,192,256")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ns = ap.parse_args()
    levels = [int(x) for x in ns.levels.split(",")]
    results: dict[str, list[dict[str, object]]] = {}
    for model, gpu in PRESETS.items():
        with tempfile.TemporaryDirectory(prefix="kvwatch-twin-rt-") as tmp:
            twin = start_twin(model, gpu, Path(tmp) / "vllm.log",
                              vllm_args=("--max-model-len", "4096"), status_dir=Path(tmp),
                              status_interval_s=1.0)  # fmt: skip
            print(model, gpu, twin.capacity_line(), flush=True)
            try:
                rows = []
                for c in levels:
                    try:
                        row = asyncio.run(_level(twin.base_url, model, c, ns.seconds))
                    except httpx.HTTPError as e:  # the client, not the twin, gave out
                        row = {"streams": c, "error": f"{type(e).__name__}: {e}"}
                    print(model, gpu, json.dumps(row), flush=True)
                    rows.append(row)
                results[f"{model} on {gpu}"] = rows
            finally:
                twin.stop()
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
