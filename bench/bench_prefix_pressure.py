"""Prefix-cache pressure on the GPU twin: conversations that fit the cache, twice as many that do
not, and the memory the load generator advises for them.

One twin (`--twin MODEL:GPU:KV_BYTES`, time scale 1) with a kvwatch sidecar beside it (1 s
scrapes), then `kvwatch loadgen run --sessions` twice on it, each `--seconds` long:
  1. `--sessions-a` live conversations (closed loop: each replaced when it ends);
  2. twice that many.
Then a fresh twin with the KV memory run 2's working set advises, the sidecar again, and run 2's
load once more. Every second the sidecar's view of the prefix cache is recorded (its hit share,
reference, prompt tokens recomputed per second, whether it judges prefix-cache thrashing), and
each run's prompt tokens by source are vLLM's own counters. Writes one JSONL of samples and a
JSON of figures. Results: docs/detection.md.

    PYTHONPATH=. .venv/bin/python bench/bench_prefix_pressure.py \
        --twin llama-3.1-8b:h100:16777216000 --sessions-a 24 --seconds 150 \
        --out bench/results/twin/prefix-pressure
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from sidecar_samples import sample_engines, write_results
from twins import twin_from_spec

from tests.sidecar.running import running_sidecar

SESSION_ARGS = ["--turns", "8", "--think-time", "uniform:5,15", "--input-len", "1500",
                "--turn-input-len", "150", "--output-len", "150"]  # fmt: skip


def _row(e: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return {
        "hit_share": s.get("prompt_cache_hit_share"),
        "hit_share_long": s.get("prompt_cache_hit_share_long"),
        "reference": s.get("prompt_cache_hit_reference"),
        "recomputed_per_s": s.get("prompt_tokens_recomputed_per_s"),
        "prompt_per_s": s.get("prompt_tokens_per_s"),
        "kv_usage": s.get("kv_usage"),
        "thrashing_since": e.get("prefix_cache_thrashing_since_unix"),
        "state": e.get("state"),
    }


def _sessions(base: str, n: int, seconds: float, run_dir: Path, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--sessions",
           "--concurrency", str(n), "--duration", f"{seconds:g}", *SESSION_ARGS, "--json",
           "--no-progress", "--run-dir", str(run_dir), "--seed", str(seed)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"kvwatch loadgen run failed ({p.returncode}): {p.stderr[-3000:]}")
    s: dict[str, Any] = json.loads(p.stdout)
    srv = s.get("server") or {}
    cached, computed = srv.get("prompt_tokens_cached") or 0, srv.get("prompt_tokens_computed") or 0
    return {
        "sessions": n, "hit_share_vllm": cached / max(cached + computed, 1),
        "prompt_tokens_cached": cached, "prompt_tokens_computed": computed,
        "seconds": s["overall"]["duration_s"], "preemptions": srv.get("preemptions"),
        "ttft_p50_by_turn": {k: v["ttft"]["p50"] for k, v in s["sessions"]["turns"].items()},
        "working_set": s["sessions"].get("working_set"),
    }  # fmt: skip


def _phase(base: str, side: str, n: int, seconds: float, tmp: Path, name: str,
           rows: list[dict[str, Any]], seed: int = 3) -> dict[str, Any]:  # fmt: skip
    phase = [name]
    stop = threading.Event()
    sampler = threading.Thread(target=sample_engines, args=(side, stop, rows, phase, _row),
                               daemon=True)  # fmt: skip
    sampler.start()
    try:
        out = _sessions(base, n, seconds, tmp / name, seed)
    finally:
        stop.set()
        sampler.join(5)
    out["sidecar"] = _judged(rows, name)
    print(name, json.dumps(out), flush=True)
    return out


def _judged(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """What the sidecar judged in a phase: when it first saw prefix-cache thrashing, and the
    longest it held one judgement (KvwatchPrefixCacheThrashing fires after prefix_for_s)."""
    mine = [r for r in rows if r["phase"] == name]
    judged = [r for r in mine if r["thrashing_since"] is not None]
    held: dict[float, float] = {}
    for r in judged:
        held[r["thrashing_since"]] = r["t"] - r["thrashing_since"]
    return {
        "judged_prefix_thrashing": bool(judged),
        "first_judged_after_s": (judged[0]["t"] - mine[0]["t"]) if judged else None,
        "longest_held_s": max(held.values(), default=0.0),
        "recomputed_per_s_mean": _mean([r["recomputed_per_s"] for r in mine[len(mine) // 2:]]),
        "hit_share_mean": _mean([r["hit_share"] for r in mine[len(mine) // 2:]]),
        "hit_share_long_min_max": _min_max([r.get("hit_share_long") for r in mine]),
        "reference_last": mine[-1]["reference"] if mine else None,
    }  # fmt: skip


def _min_max(xs: list[float | None]) -> list[float] | None:
    vals = [x for x in xs if x is not None]
    return [min(vals), max(vals)] if vals else None


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--twin", required=True, metavar="MODEL:GPU:KV_BYTES")
    ap.add_argument("--sessions-a", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--seed", type=int, default=3, help="the load generator's seed (3)")
    ap.add_argument("--out", type=Path, required=True, help="PREFIX: PREFIX.jsonl, PREFIX.json")
    ap.add_argument(
        "--recount",
        action="store_true",
        help="recompute the sidecar's figures from PREFIX.jsonl into PREFIX.json",
    )
    ns = ap.parse_args()
    if ns.recount:
        rows = [json.loads(x) for x in ns.out.with_suffix(".jsonl").read_text().splitlines()]
        figures = json.loads(ns.out.with_suffix(".json").read_text())
        for name in ("fits", "twice", "advised"):
            if name in figures:
                figures[name]["sidecar"] = _judged(rows, name)
        ns.out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
        return
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"twin": ns.twin, "session_args": SESSION_ARGS, "seed": ns.seed}
    try:
        with (
            twin_from_spec(ns.twin, tmp / "a" / "vllm.log") as twin,
            running_sidecar(["--target", twin.base_url, "--interval", "1"]) as side,
        ):
            figures["fits"] = _phase(twin.base_url, side, ns.sessions_a, ns.seconds, tmp,
                                     "fits", rows, ns.seed)  # fmt: skip
            figures["twice"] = _phase(twin.base_url, side, 2 * ns.sessions_a, ns.seconds, tmp,
                                      "twice", rows, ns.seed)  # fmt: skip
        advised = (figures["twice"]["working_set"] or {}).get("advised_kv_cache_memory_bytes")
        if advised:
            model, gpu, _ = ns.twin.split(":")
            spec = f"{model}:{gpu}:{advised}"
            figures["advised_twin"] = spec
            with (
                twin_from_spec(spec, tmp / "c" / "vllm.log") as twin,
                running_sidecar(["--target", twin.base_url, "--interval", "1"]) as side,
            ):
                figures["advised"] = _phase(twin.base_url, side, 2 * ns.sessions_a,
                                            ns.seconds, tmp, "advised", rows, ns.seed)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(ns.out, rows, figures)


if __name__ == "__main__":
    main()
