"""How many concurrent streams the twin keeps in real time on this machine.

Starts the twin at time scale 1, holds C closed-loop streams of 100 prompt + 200 output tokens
for a while at each C, and reads the twin's own counters: the share of wall time the simulated
card sat idle while running requests waited on this machine's CPU (`kvwatch_twin_behind_*`),
and the tokens generated per wall second. Real time holds while that share stays under 10%.
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


async def _level(url: str, model: str, streams: int, seconds: float) -> dict[str, float]:
    rng = random.Random(streams)
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def stream() -> None:
            while time.monotonic() < stop:
                body = {
                    "model": model,
                    "prompt": [rng.randrange(3, 4000) for _ in range(100)],
                    "max_tokens": 200,
                    "ignore_eos": True,
                    "stream": True,
                }
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        pass

        before = scrape((await client.get("/metrics")).text)
        t0 = time.monotonic()
        await asyncio.gather(*(stream() for _ in range(streams)))
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
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="64,128,256,512")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ns = ap.parse_args()
    levels = [int(x) for x in ns.levels.split(",")]
    results: dict[str, list[dict[str, float]]] = {}
    for model, gpu in PRESETS.items():
        with tempfile.TemporaryDirectory(prefix="kvwatch-twin-rt-") as tmp:
            twin = start_twin(model, gpu, Path(tmp) / "vllm.log",
                              vllm_args=("--max-model-len", "4096"), status_dir=Path(tmp),
                              status_interval_s=1.0)  # fmt: skip
            try:
                rows = []
                for c in levels:
                    row = asyncio.run(_level(twin.base_url, model, c, ns.seconds))
                    print(model, gpu, json.dumps(row), flush=True)
                    rows.append(row)
                results[f"{model} on {gpu}"] = rows
            finally:
                twin.stop()
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
