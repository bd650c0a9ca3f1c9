"""Priority scheduling on the GPU twin: a mixed-priority load on a cache too small for it, under
vLLM's `--scheduling-policy priority`, against the same load without priorities on a default
(fcfs) server. The sidecar, following each twin's log, should report the first as the policy at
work (lower classes giving way: `kvwatch_policy_preemptions_per_second`, never thrashing) and
page the second as thrashing.

Per run: a twin (`--twin MODEL:GPU:KV_BYTES`, time scale 1; the first with
`--scheduling-policy priority`), a sidecar reading its log from the start (the launch line
names the policy) at 1 s scrapes, and `kvwatch loadgen run --concurrency N` for `--seconds`
with bystander probes; the first run's requests carry `--priorities`. Both twins send vLLM's
own per-request timings (`--enable-per-request-metrics`). Every second the
sidecar's state, reasons, preemption rate and policy preemption rate are recorded. Writes one
JSONL of samples and a JSON of figures. Results: docs/detection.md, docs/loadgen.md.

    PYTHONPATH=. .venv/bin/python bench/bench_priority_policy.py \
        --twin llama-3.1-8b:h100:16777216000 --streams 128 --seconds 120 \
        --out bench/results/twin/priority-policy
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

LOAD_ARGS = ["--input-len", "1000", "--output-len", "500", "--probe-rate", "1",
             "--probe-input-len", "64", "--probe-output-len", "16"]  # fmt: skip


def _row(e: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": e.get("state"), "reasons": e.get("state_reasons"),
        "policy": s.get("scheduling_policy"),
        "preemptions_per_s": s.get("preemptions_per_s_short"),
        "policy_preemptions_per_s": s.get("policy_preemptions_per_s"),
        "running": s.get("running"), "waiting": s.get("waiting"), "kv_usage": s.get("kv_usage"),
    }  # fmt: skip


def _load(base: str, streams: int, seconds: float, run_dir: Path, extra: list[str]
          ) -> dict[str, Any]:  # fmt: skip
    cmd = [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--concurrency",
           str(streams), "--duration", f"{seconds:g}", *LOAD_ARGS, *extra, "--json",
           "--no-progress", "--run-dir", str(run_dir), "--seed", "5"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"kvwatch loadgen run failed ({p.returncode}): {p.stderr[-3000:]}")
    s: dict[str, Any] = json.loads(p.stdout)
    o = s["overall"]

    def brief(g: dict[str, Any]) -> dict[str, Any]:
        return {"completed": g.get("completed"), "ttft_p50": g["ttft"]["p50"],
                "ttft_p99": g["ttft"]["p99"], "e2e_p99": g["e2e"]["p99"],
                "stalls": g.get("stalls"), "requests_with_stalls": g.get("requests_with_stalls"),
                "output_token_throughput": g.get("output_token_throughput")}  # fmt: skip

    srv = s.get("server") or {}
    return {
        "load": brief(o), "preemptions": srv.get("preemptions"),
        "repeat_preempted": srv.get("repeat_preempted"),
        "classes": {k: brief(v) for k, v in (s.get("classes") or {}).items()},
        "probes": brief(s["probes"]["overall"]) if s.get("probes") else None,
        "server_timings": o.get("server_timings"),
    }  # fmt: skip


def _judged(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    mine = [r for r in rows if r["phase"] == name]
    states: dict[str, int] = {}
    for r in mine:
        states[r["state"]] = states.get(r["state"], 0) + 1
    thrash = [r for r in mine if r["state"] == "thrashing"]
    policy_said = [r for r in mine if any("--scheduling-policy priority" in x
                                          for x in r.get("reasons") or [])]  # fmt: skip
    return {
        "policy_seen": sorted({str(r["policy"]) for r in mine}),
        "seconds_by_state": states,
        "first_thrashing_after_s": (thrash[0]["t"] - mine[0]["t"]) if thrash else None,
        "seconds_reported_as_policy": len(policy_said),
        "policy_preemptions_per_s_max": max(
            (r["policy_preemptions_per_s"] or 0 for r in mine), default=0.0
        ),
        "preemptions_per_s_max": max((r["preemptions_per_s"] or 0 for r in mine), default=0.0),
        "example_reasons": (policy_said or thrash or [{}])[0].get("reasons"),
    }


def _run(ns: argparse.Namespace, tmp: Path, name: str, twin_extra: tuple[str, ...],
         load_extra: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    log = tmp / name / "vllm.log"
    with (
        twin_from_spec(ns.twin, log, *twin_extra) as twin,
        running_sidecar(
            ["--target", twin.base_url, "--interval", "1", "--log", str(log), "--log-from-start"]
        ) as side,  # fmt: skip
    ):
        stop = threading.Event()
        sampler = threading.Thread(target=sample_engines, args=(side, stop, rows, [name], _row),
                                   daemon=True)  # fmt: skip
        sampler.start()
        try:
            out = _load(twin.base_url, ns.streams, ns.seconds, tmp / name / "run", load_extra)
        finally:
            stop.set()
            sampler.join(5)
    out["sidecar"] = _judged(rows, name)
    print(name, json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--twin", required=True, metavar="MODEL:GPU:KV_BYTES")
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--priorities", default="0:0.3,1:0.7")
    ap.add_argument("--out", type=Path, required=True, help="PREFIX: PREFIX.jsonl, PREFIX.json")
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"twin": ns.twin, "streams": ns.streams, "seconds": ns.seconds,
                               "load_args": LOAD_ARGS, "priorities": ns.priorities}  # fmt: skip
    try:
        timings = ("--enable-per-request-metrics",)  # vLLM's own timings beside the client's
        figures["priority"] = _run(ns, tmp, "priority",
                                   ("--scheduling-policy", "priority", *timings),
                                   ["--priorities", ns.priorities], rows)  # fmt: skip
        figures["fcfs"] = _run(ns, tmp, "fcfs", timings, [], rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(ns.out, rows, figures)


if __name__ == "__main__":
    main()
