"""A published trace replayed on the GPU twin: timing, token counts, and the prefix cache's hits.

Starts the twin (`--twin MODEL:GPU:KV_BYTES`, time scale 1, pinned to core 0 with its threads
and children) and replays `--trace` with `kvwatch loadgen run --trace` on core 1 (window, speed
and length scale as given), then says:
- arrival accuracy: each request's send time against the trace's (scaled) time, p50 / p99 / max;
- token counts: requests whose prompt and output token counts, as the server reported them in
  its usage, equal the trace's (scaled) lengths;
- the prefix cache: the hit rate vLLM's counters measured (prompt tokens by source) against the
  one the trace's `hash_ids` imply for a cache that holds everything (loadgen/workload/trace.py).
Results: docs/loadgen.md.

    PYTHONPATH=. .venv/bin/python bench/bench_trace_replay.py \
        --twin llama-3.1-8b:h200:107374182400 --trace conversation_trace.jsonl \
        --window 0:300 --speed 5 --length-scale 0.1 [--save bench/results/twin/trace-...json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from twins import twin_from_spec

TWIN_CORE, CLIENT_CORE = "0", "1"


def _pin_tree(pid: int, core: str) -> None:
    """Pin a process, its threads and its descendants to one core (the twin's API server,
    engine and their threads), so that the load generator has the other to itself."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    for child in kids.split():
        _pin_tree(int(child), core)
    subprocess.run(["taskset", "-a", "-p", "-c", core, str(pid)], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--twin", required=True, metavar="MODEL:GPU:KV_BYTES")
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--window", default="0:300", metavar="START:END")
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--length-scale", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--save", type=Path, help="write the figures as JSON here too")
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    try:
        with twin_from_spec(ns.twin, tmp / "vllm.log", "--max-model-len",
                            str(ns.max_model_len)) as twin:  # fmt: skip
            print(f"twin: {ns.twin}; {twin.capacity_line()}", flush=True)
            if twin.server.pid is not None:
                _pin_tree(twin.server.pid, TWIN_CORE)
            run_dir = tmp / "run"
            cmd = ["taskset", "-c", CLIENT_CORE, sys.executable, "-m", "kvwatch", "loadgen", "run",
                   "--url", twin.base_url,
                   "--trace", str(ns.trace), "--trace-window", ns.window, "--trace-speed",
                   str(ns.speed), "--trace-length-scale", str(ns.length_scale), "--json",
                   "--no-progress", "--run-dir", str(run_dir), "--workers",
                   str(ns.workers)]  # fmt: skip
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode not in (0, 1):
                raise SystemExit(f"kvwatch loadgen run failed ({p.returncode}): {p.stderr[-3000:]}")
            summary = json.loads(p.stdout)
            print(p.stderr.strip())
            out = _figures(summary, pd.read_json(run_dir / "requests.jsonl", lines=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out |= {"twin": ns.twin, "trace": ns.trace.name, "window": ns.window, "speed": ns.speed,
            "length_scale": ns.length_scale}  # fmt: skip
    for k, v in out.items():
        print(f"{k}: {v}")
    if ns.save:
        ns.save.parent.mkdir(parents=True, exist_ok=True)
        ns.save.write_text(json.dumps(out, indent=1) + "\n")


def _figures(summary: dict[str, Any], df: pd.DataFrame) -> dict[str, Any]:
    lag = df["dispatch_lag"].dropna()
    ok = df[df["error"].isna()]
    exact_in = (ok["prompt_tokens"] == ok["expected_input_tokens"]).sum()
    exact_out = (ok["output_tokens"] == ok["expected_output_tokens"]).sum()
    tr = summary["trace"]
    return {
        "requests": len(df), "completed": len(ok),
        "arrival_error_ms": {"p50": round(float(lag.quantile(0.5)) * 1e3, 3),
                             "p99": round(float(lag.quantile(0.99)) * 1e3, 3),
                             "max": round(float(lag.max()) * 1e3, 3)},
        "prompt_tokens_exact": f"{exact_in}/{len(ok)}",
        "output_tokens_exact": f"{exact_out}/{len(ok)}",
        "implied_prefix_hit_rate": round(tr["implied_prefix_hit_rate"], 4),
        "measured_prefix_hit_rate": (None if tr["measured_prefix_hit_rate"] is None
                                     else round(tr["measured_prefix_hit_rate"], 4)),
        "clipped": tr["clipped"], "span_s": round(tr["span_s"], 1),
        "preemptions": (summary.get("server") or {}).get("preemptions"),
        "output_tok_s": round(summary["overall"]["output_token_throughput"] or 0),
    }  # fmt: skip


if __name__ == "__main__":
    main()
