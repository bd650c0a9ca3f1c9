"""The seed's scenario on the twin: Llama 3.1 8B on a simulated H100, 100 requests of 1,000
prompt tokens decoding 500 each, with a KV budget (8,000 blocks of 16) they outgrow.

Checks, as docs/twin.md reports them: the new-block demand per step read off the twin's KV usage
(100 / 16 = 6.25 expected), the cache running dry before any request finished, the first victim
being the newest admitted request (vLLM's FCFS policy), and the victim's recompute arriving as
one prefill. Writes bench/results/twin/seed.json.

    PYTHONPATH=. .venv/bin/python bench/bench_twin_seed.py [--time-scale 2] [--requests 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from kvwatch.twin.serve import start_twin
from tests.twin.seed import run_seed

OUT = Path(__file__).parent / "results" / "twin" / "seed.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=8000)
    ap.add_argument("--out", type=Path, default=OUT)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvwatch-twin-seed-") as tmp:
        log = Path(tmp) / "vllm.log"
        twin = start_twin(
            "llama-3.1-8b",
            "h100",
            log,
            time_scale=ns.time_scale,
            vllm_args=(
                "--max-model-len",
                "4096",
                "--kv-cache-memory-bytes",
                str(ns.blocks * 16 * 131072),
            ),  # fmt: skip
            status_dir=Path(tmp),
            status_interval_s=0.25,
        )
        try:
            r = asyncio.run(run_seed(twin.base_url, "llama-3.1-8b", log, requests=ns.requests))
            line = twin.capacity_line()
        finally:
            twin.stop()
    result = dict(r.to_dict(), time_scale=ns.time_scale, capacity_line=line)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
