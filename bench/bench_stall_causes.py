"""Every stall's cause, as the load generator reads it, held to the twin's step trace.

The GPU twin (vLLM's own engine, the card simulated; `kvwatch twin --step-trace`) writes what
each engine step carried: new prompt tokens, recomputed tokens, the requests it preempted or
left out, when the card finished it. `loadgen/results/stall_truth.py` reads the true cause of
every stall from that; `loadgen/results/stall_causes.py` names one from what a client can see
of any vLLM (the other streams, the server's counters once a second). This bench runs loads
where each cause happens and reports how often the two agree, per load and per cause.

  thrash   Llama 3.1 8B on an H100 with 2 GiB of KV: Poisson arrivals of 1024 + 512 tokens
           at 6/s outgrow the cache: victims, and the streams behind their recompute
  prefill  the same card with 24 GiB: 32 closed-loop streams of 128 + 1024 tokens, and beside
           them prompts of 12,000 tokens at 1/s (a second load generator): each prefill step
           stalls every stream (`--max-num-batched-tokens 16384`, one chunk a prompt)
  burst    2 GiB, 48 requests of 256 + 1024 tokens at once and no more: their growth
           thrashes, and the steps that recompute the victims carry no new prompt
  mixed    2 GiB, Poisson 1024 + 512 tokens at 4/s and 4,000-token prompts at 0.5/s beside

Results: bench/results/stall-causes.json, docs/loadgen.md. Twin figures, wall time (time scale
`--time-scale`, default 2: this machine's API server keeps up with the card).

    PYTHONPATH=. .venv/bin/python bench/bench_stall_causes.py [--only thrash] [--seconds 60]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvwatch.loadgen.results.rundir import read_jsonl, read_records
from kvwatch.loadgen.results.stall_causes import CAUSES, ServerCounters, attribute_stalls
from kvwatch.loadgen.results.stall_truth import truth_causes
from kvwatch.loadgen.results.step_trace import read_step_trace
from kvwatch.twin.serve import start_twin

HERE = Path(__file__).resolve().parent
GIB = 2**30
# name: (KV bytes, the loads run side by side (the first is judged), vLLM arguments)
LOADS: dict[str, tuple[int, list[list[str]], tuple[str, ...]]] = {
    "thrash": (2 * GIB, [["--rate", "6", "--input-len", "1024", "--output-len", "512"]],
               ("--max-model-len", "4096")),
    "prefill": (
        24 * GIB,
        [["--concurrency", "32", "--input-len", "128", "--output-len", "1024"],
         ["--rate", "1", "--input-len", "12000", "--output-len", "8"]],
        ("--max-model-len", "16384", "--max-num-batched-tokens", "16384"),
    ),
    "burst": (
        2 * GIB,
        [["--concurrency", "48", "--requests", "48", "--input-len", "256",
          "--output-len", "1024"]],
        ("--max-model-len", "4096"),
    ),
    "mixed": (
        2 * GIB,
        [["--rate", "4", "--input-len", "1024", "--output-len", "512"],
         ["--rate", "0.5", "--input-len", "4000", "--output-len", "8"]],
        ("--max-model-len", "8192", "--max-num-batched-tokens", "8192"),
    ),
}  # fmt: skip


def _run(
    name: str, seconds: float, time_scale: float, work: Path, budget: int | None = None
) -> dict[str, Any]:
    kv, loads, vllm_args = LOADS[name]
    if budget is not None:  # the prompt budget advised, as `advise --run` gave it
        i = vllm_args.index("--max-num-batched-tokens")
        vllm_args = (*vllm_args[: i + 1], str(budget), *vllm_args[i + 2 :])
    trace = work / f"{name}-steps.jsonl"
    with start_twin(
        "llama-3.1-8b", "h100", work / f"{name}-vllm.log", time_scale=time_scale,
        status_dir=work, step_trace=trace,
        vllm_args=("--kv-cache-memory-bytes", str(kv), *vllm_args),
    ) as twin:  # fmt: skip
        procs = []
        for i, load in enumerate(loads):
            run_dir = work / f"{name}-{i}"
            cmd = [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
                   "--run-dir", str(run_dir), "--no-progress", "--seed", str(7 + i),
                   *(() if "--requests" in load else ("--duration", str(seconds))),
                   *load]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for p in procs:
            _, err = p.communicate(timeout=seconds * 10 + 300)
            if p.returncode not in (0, 1):
                raise SystemExit(f"{name}: loadgen failed ({p.returncode}): {err[-800:]!r}")
        time.sleep(1.5)  # the trace is flushed a second apart
    row = _judge(name, work, rejudge=False)
    row["vllm_args"] = list(vllm_args)
    row["clients"] = [_client(work / f"{name}-{i}") for i in range(len(loads))]
    return row


def _client(run_dir: Path) -> dict[str, Any]:
    """What one load generator saw: its stalls by cause, TTFT and tokens/s."""
    o = json.loads((run_dir / "summary.json").read_text())["overall"]
    causes = o.get("stall_causes") or {}
    return {"stalls": o["stalls"], "stall_s": sum(v["seconds"] for v in causes.values()),
            "causes": causes, "ttft_p50": o["ttft"]["p50"], "ttft_p99": o["ttft"]["p99"],
            "itl_p50": o["itl"]["p50"], "output_tok_s": o["output_token_throughput"],
            "completed": o["completed"]}  # fmt: skip


def _judge(name: str, work: Path, rejudge: bool) -> dict[str, Any]:
    """The run's stall causes (as the load generator wrote them, or judged again from its
    records and timeline with today's code: `rejudge`) against the step trace's."""
    kv, loads, vllm_args = LOADS[name]
    steps, bad = read_step_trace(work / f"{name}-steps.jsonl")
    run_dir = work / f"{name}-0"
    records = read_records(run_dir)
    start_unix = float(json.loads((run_dir / "spec.json").read_text())["start_unix"])
    if rejudge:
        rows = read_jsonl(run_dir / "timeline.jsonl")
        attribute_stalls(records, ServerCounters(rows), start_unix)
    truth = truth_causes(records, steps, start_unix)
    pairs = []
    for r in records:
        if r.get("server_id") in truth:
            pairs += list(zip(truth[r["server_id"]], r.get("stall_causes") or [], strict=False))
    agree = sum(t == a for t, a in pairs)
    by_truth: dict[str, dict[str, int]] = {}
    for t, a in pairs:
        by_truth.setdefault(t, dict.fromkeys(CAUSES, 0))[a] += 1
    return {
        "load": name,
        "rejudged": rejudge,
        "kv_bytes": kv,
        "loads": loads,
        "vllm_args": list(vllm_args),
        "steps": len(steps),
        "bad_trace_lines": bad,
        "preemptions": sum(len(s.preempted) for s in steps),
        "stalls": len(pairs),
        "agree": agree,
        "agreement": agree / len(pairs) if pairs else None,
        "truth": dict(collections.Counter(t for t, _ in pairs)),
        "attributed": dict(collections.Counter(a for _, a in pairs)),
        "by_truth": by_truth,  # true cause -> what was attributed
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(LOADS), action="append")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--budget", type=int, metavar="TOKENS",
                    help="this --max-num-batched-tokens instead (the advice's rerun)")  # fmt: skip
    ap.add_argument("--keep", type=Path, metavar="DIR", help="leave the runs and traces here")
    ap.add_argument("--rejudge", type=Path, metavar="DIR",
                    help="judge the runs kept in DIR again with today's code; no twin")  # fmt: skip
    ns = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory(prefix="kvwatch-stalls-") as tmp:
        work = ns.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in ns.only or list(LOADS):
            if ns.rejudge:
                row = _judge(name, ns.rejudge, rejudge=True)
            else:
                row = _run(name, ns.seconds, ns.time_scale, work, ns.budget)
            out.append(row)
            share = row["agreement"]
            print(f"{name}: {row['stalls']} stalls, {row['agree']} agree "
                  f"({'-' if share is None else f'{share:.0%}'}); truth {row['truth']}; "
                  f"attributed {row['attributed']}; {row['preemptions']} preemptions, "
                  f"{row['steps']} steps", flush=True)  # fmt: skip
            for t, got in row["by_truth"].items():
                print(f"  truly {t}: { ({k: v for k, v in got.items() if v}) }", flush=True)
    result = {"time_scale": ns.time_scale, "seconds": ns.seconds,
              "date": time.strftime("%Y-%m-%d"), "runs": out}  # fmt: skip
    if ns.rejudge:
        return
    dest = HERE / "results" / "stall-causes.json"
    if ns.only or ns.budget:
        tag = "-".join(ns.only or []) + (f"-budget-{ns.budget}" if ns.budget else "")
        dest = dest.with_name(f"stall-causes-{tag.strip('-')}.json")
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
