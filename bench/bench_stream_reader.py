"""The load generator's stream reader against `vllm bench serve`, side by side and pinned.

The FAKE streaming server (bench/fast_server.py, written to outrun any client) runs on core 0,
each client on core 1 (`taskset`), one after the other, so neither tool shares its core with
the server or the other tool. Client CPU is the client process's user + system time
(getrusage of the finished child) over the output tokens it read.

    PYTHONPATH=. .venv/bin/python bench/bench_stream_reader.py [--repeats 3]

- long: 512-token streams, 32 in flight, 1,024 requests: steady output tokens/s
- short: 16-token requests, 32 in flight, 8,000 requests: requests/s
- 500/s: kvwatch alone at a constant 500 requests/s for 10 s (16 tokens): dispatch lag p50 and
  p99, and a check that every inter-token gap was recorded
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fast_server import serving  # bench/, the script's own folder

from kvwatch.local.tiny_model import build_tiny_model

HERE = Path(__file__).resolve().parent
SERVER_CORE, CLIENT_CORE = "0", "1"
IN_FLIGHT = 32


def _timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run pinned to the client core; returns the result and the child's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(["taskset", "-c", CLIENT_CORE, *cmd], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {p.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, cpu


def kvwatch(url: str, out_len: int, stage_args: list[str]) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    p, cpu = _timed(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", url, "--input-len", "16",
         "--output-len", str(out_len), "--no-progress", "--json", "--run-dir", str(run_dir),
         *stage_args]
    )  # fmt: skip
    overall = json.loads(p.stdout)["overall"]
    gaps = tokens = chunks = 0
    with (run_dir / "requests.jsonl").open() as fh:
        for line in fh:
            r = json.loads(line)
            gaps += len(r["gaps"])
            chunks += r["chunks"]
            tokens += r["output_tokens"] or 0
    lag = overall["dispatch_lag"]
    return {
        "req_s": overall["request_throughput"],
        "tok_s": overall["output_token_throughput"],
        "cpu_us_per_token": cpu / max(tokens, 1) * 1e6,
        "lag_p50_ms": lag["p50"] * 1e3,
        "lag_p99_ms": lag["p99"] * 1e3,
        "all_gaps": float(gaps == chunks - overall["requests"]),
    }


def vllm_bench(url: str, out_len: int, n: int) -> dict[str, float]:
    p, cpu = _timed(
        [sys.executable, str(HERE / "vllm_bench_serve.py"), "--backend", "openai",
         "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake-model",
         "--tokenizer", str(build_tiny_model()), "--dataset-name", "random",
         "--random-input-len", "16", "--random-output-len", str(out_len), "--ignore-eos",
         "--num-prompts", str(n), "--request-rate", "inf",
         "--max-concurrency", str(IN_FLIGHT), "--disable-tqdm"]
    )  # fmt: skip

    def grab(label: str) -> float:
        m = re.search(re.escape(label) + r"\s+([\d.]+)", p.stdout)
        return float(m[1]) if m else float("nan")

    tokens = grab("Total generated tokens:")
    return {
        "req_s": grab("Request throughput (req/s):"),
        "tok_s": grab("Output token throughput (tok/s):"),
        "cpu_us_per_token": cpu / max(tokens, 1) * 1e6,  # tokenizer and dataset included
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, the median shown")
    ns = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores: the server on one, the client on the other")
    with serving(SERVER_CORE) as url:
        closed = ["--concurrency", str(IN_FLIGHT)]
        rows = []
        for name, out_len, n in (("long (512 tokens)", 512, 1024), ("short (16 tokens)", 16, 8000)):
            k = _median([kvwatch(url, out_len, [*closed, "--requests", str(n)])
                         for _ in range(ns.repeats)])  # fmt: skip
            v = _median([vllm_bench(url, out_len, n) for _ in range(ns.repeats)])
            rows.append((name, k, v))
        steady = _median([kvwatch(url, 16, ["--stage", "constant:rate=500@10s"])
                          for _ in range(ns.repeats)])  # fmt: skip
    print(f"{IN_FLIGHT} in flight; the median of {ns.repeats} runs each")
    print("| workload | tool | req/s | output tok/s | client CPU per token | ratio (tok/s) |")
    print("|---|---|---|---|---|---|")
    for name, k, v in rows:
        print(f"| {name} | kvwatch | {k['req_s']:,.0f} | {k['tok_s']:,.0f} | "
              f"{k['cpu_us_per_token']:.1f} us | {k['tok_s'] / v['tok_s']:.2f}x |")  # fmt: skip
        print(f"| {name} | vllm bench serve | {v['req_s']:,.0f} | {v['tok_s']:,.0f} | "
              f"{v['cpu_us_per_token']:.1f} us | 1.00x |")  # fmt: skip
    print(f"\nconstant 500/s, 10 s (kvwatch): {steady['req_s']:.0f} req/s, dispatch lag p50 "
          f"{steady['lag_p50_ms']:.2f} ms, p99 {steady['lag_p99_ms']:.2f} ms, "
          f"{steady['cpu_us_per_token']:.1f} us of CPU per token, every gap recorded: "
          f"{bool(steady['all_gaps'])}")  # fmt: skip


if __name__ == "__main__":
    main()
