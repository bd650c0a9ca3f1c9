"""The sizing levers, proven the way tests/sizing/test_advice_proven.py does, on two workloads.

For each workload: run it on the tiny-model vLLM (CPU, 40 blocks of 32 tokens), ask
`kvwatch advise --run` for the levers (more KV memory, --max-num-seqs, --max-num-active-seqs,
--watermark), restart vLLM with each advised setting and rerun the same seeded workload. Prints
one markdown row per server setting.

  spikes     8 requests of 30 + 300 tokens at once every 12 s (what the test runs)
  saturated  32 requests of 30 + 300 tokens, all in flight (closed loop): the server never idles

    PYTHONPATH=. .venv/bin/python bench/bench_sizing_levers.py [--workload spikes|saturated]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kvwatch.local.tiny_model import build_tiny_model
from tests.sizing.test_advice_proven import LENGTHS, WORKLOAD, rerun

# the spikes are exactly what the test runs, and run the same way, so the two cannot drift apart
WORKLOADS = {
    "spikes": WORKLOAD,
    "saturated": ["--concurrency", "32", "--requests", "32", *LENGTHS],
}


def _row(workload: str, setting: str, o: dict[str, float], base: dict[str, float]) -> str:
    ratio = o["output_token_throughput"] / base["output_token_throughput"]
    return (
        f"| {workload} | {setting} | {o['preemptions']:.0f} | "
        f"{o['output_token_throughput']:,.0f} ({ratio:.2f}x) | {o['e2e_p99']:.2f} s | "
        f"{o['stalls']:.0f} ({o['stalls_preempting']:.0f}) |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    ns = ap.parse_args()
    model = build_tiny_model()
    print("| workload | setting | preemptions | output tok/s | e2e p99 | stalls (preempting) |")
    print("|---|---|---|---|---|---|")
    for workload in ns.workload or sorted(WORKLOADS):
        load = WORKLOADS[workload]
        with tempfile.TemporaryDirectory(prefix="kvwatch-levers-") as tmp:
            work = Path(tmp)
            base = rerun(model, work / "before", load)
            advise = [sys.executable, "-m", "kvwatch", "advise", "--run", str(work / "before")]
            p = subprocess.run([*advise, "--json"], capture_output=True, text=True)
            advice = json.loads(p.stdout)[0]["advice"]
            print(_row(workload, "before (40 blocks)", base, base), flush=True)
            kv = advice["kv_cache_memory_bytes"]
            mem = rerun(model, work / "memory", load, kv_cache_memory_bytes=kv)
            print(_row(workload, f"`--kv-cache-memory-bytes {kv}`", mem, base), flush=True)
            n = advice["max_num_seqs"]
            for flag in ("--max-num-seqs", advice["concurrency_flag"]):
                o = rerun(model, work / flag.strip("-"), load, extra_args=(flag, str(n)))
                print(_row(workload, f"`{flag} {n}`", o, base), flush=True)
            w = advice["watermark"]
            if w is not None:
                o = rerun(model, work / "watermark", load, extra_args=("--watermark", str(w)))
                print(_row(workload, f"`--watermark {w}`", o, base), flush=True)


if __name__ == "__main__":
    main()
