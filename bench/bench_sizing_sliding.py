"""Memory advice on a real sliding-window server, against the smallest memory that works.

The tiny Llama with a 64-token window on every other layer (two KV cache groups, 128 KiB blocks, 80
of them in 10 MiB) runs the spikes of tests/sizing/test_advice_proven_swa.py (8 requests of 30 + 300
tokens at once every 12 s, 48 s). Rows: the server as it was; the memory `advise --run` gives
without `--model` (every layer taken as full attention); the memory it gives with `--model` (vLLM's
groups); then a bisection over the block count for the smallest memory at which the same seeded
load, rerun, has at least 90% fewer preemptions at 85% of the throughput.

    PYTHONPATH=. .venv/bin/python bench/bench_sizing_sliding.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kvwatch.local.tiny_model import SWA_SPEC, build_tiny_model
from tests.sizing.test_advice_proven import rerun
from tests.sizing.test_advice_proven_swa import KV_BYTES, SWA_WORKLOAD

BLOCK_BYTES = 4 * 32 * 4 * 128 * 2  # 4 layers a group x 32 tokens x 4 KV heads x (64 + 64) x bf16


def _advice(run_dir: Path, *extra: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--run", str(run_dir), "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(p.stdout)[0]["advice"]


def _works(o: dict[str, float], base: dict[str, float]) -> bool:
    return (
        o["preemptions"] <= 0.1 * base["preemptions"]
        and o["output_token_throughput"] >= 0.85 * base["output_token_throughput"]
    )


def _row(setting: str, blocks: int, o: dict[str, float], base: dict[str, float]) -> str:
    ratio = o["output_token_throughput"] / base["output_token_throughput"]
    verdict = "works" if _works(o, base) else "thrashes"
    return (
        f"| {setting} | {blocks} | {o['preemptions']:.0f} | "
        f"{o['output_token_throughput']:,.0f} ({ratio:.2f}x) | {o['e2e_p99']:.2f} s | {verdict} |"
    )


def main() -> None:
    model = build_tiny_model(SWA_SPEC)
    print("| setting | blocks | preemptions | output tok/s | e2e p99 | verdict |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="kvwatch-swa-") as tmp:
        work = Path(tmp)
        base = rerun(model, work / "before", SWA_WORKLOAD)
        print(_row("before", KV_BYTES // BLOCK_BYTES, base, base), flush=True)
        tried: dict[int, bool] = {KV_BYTES // BLOCK_BYTES: _works(base, base)}
        for label, extra in (("advise without --model", ()), ("advise --model", ("--model",))):
            adv = _advice(work / "before", *(extra and (extra[0], str(model))))
            kv = adv["kv_cache_memory_bytes"]
            o = rerun(model, work / label.replace(" ", "-"), SWA_WORKLOAD, kv_cache_memory_bytes=kv)
            tried[kv // BLOCK_BYTES] = _works(o, base)
            print(_row(f"{label}: `--kv-cache-memory-bytes {kv}`", kv // BLOCK_BYTES, o, base),
                  flush=True)  # fmt: skip
            advised = kv // BLOCK_BYTES
        lo = max(b for b, ok in tried.items() if not ok)
        hi = min(b for b, ok in tried.items() if ok)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            o = rerun(model, work / f"bisect-{mid}", SWA_WORKLOAD,
                      kv_cache_memory_bytes=mid * BLOCK_BYTES)  # fmt: skip
            ok = _works(o, base)
            print(_row("bisection", mid, o, base), flush=True)
            lo, hi = (lo, mid) if ok else (mid, hi)
        print(f"\nsmallest that works: {hi} blocks ({hi * BLOCK_BYTES} B); advised {advised} "
              f"blocks = {advised / hi:.2f}x of it")  # fmt: skip


if __name__ == "__main__":
    main()
