"""How fast the load generator drives a server, next to `vllm bench serve`, on the same machine.

Both drive bench/fast_server.py (a FAKE streaming server written to outrun any client) with
16-token prompts. Rated runs use Poisson arrivals for both tools; the max-throughput run sends all
requests at once (`--request-rate inf` for vllm bench serve, an unbounded constant rate for
kvwatch). kvwatch also reports its own dispatch lag (sent time minus scheduled time), with one
sender process and with two (`--workers 2`). Results: docs/benchmarks.md.

    .venv/bin/python bench/bench_loadgen.py [--rates 100,200,400] [--seconds 10]
                                            [--max-requests 2000]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from fast_server import serving  # bench/, the script's own folder

from kvwatch.local.tiny_model import build_tiny_model

HERE = Path(__file__).resolve().parent


def _kvwatch(url: str, stage: str, out_len: int, workers: int = 1) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", url, "--stage", stage,
         "--input-len", "16", "--output-len", str(out_len), "--no-progress", "--json",
         "--run-dir", str(run_dir), "--workers", str(workers)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(p.stdout)["overall"]


def _vllm(url: str, rate: str, n: int, out_len: int) -> dict[str, float]:
    p = subprocess.run(
        [sys.executable, str(HERE / "vllm_bench_serve.py"), "--backend", "openai",
         "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake-model",
         "--tokenizer", str(build_tiny_model()), "--dataset-name", "random",
         "--random-input-len", "16", "--random-output-len", str(out_len), "--ignore-eos",
         "--num-prompts", str(n), "--request-rate", rate, "--disable-tqdm"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip

    def grab(label: str) -> float:
        m = re.search(re.escape(label) + r"\s+([\d.]+)", p.stdout)
        return float(m[1]) if m else float("nan")

    return {"req_s": grab("Request throughput (req/s):"),
            "tok_s": grab("Output token throughput (tok/s):"),
            "failed": grab("Failed requests:")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="100,200,400")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=16)
    ns = ap.parse_args()
    with serving() as url:
        print("| load | tool | req/s | output tok/s | dispatch lag p50 / p99 |")
        print("|---|---|---|---|---|")
        for rate in [float(r) for r in ns.rates.split(",")]:
            for workers in (1, 2):
                k = _kvwatch(url, f"poisson:rate={rate:g}@{ns.seconds:g}s", ns.output_len, workers)
                lag = k["dispatch_lag"]
                print(f"| Poisson {rate:g}/s | kvwatch, {workers} process(es) | "
                      f"{k['request_throughput']:.1f} | {k['output_token_throughput']:.0f} | "
                      f"{lag['p50'] * 1e3:.2f} / {lag['p99'] * 1e3:.2f} ms |")  # fmt: skip
            v = _vllm(url, f"{rate:g}", int(rate * ns.seconds), ns.output_len)
            print(f"| Poisson {rate:g}/s | vllm bench serve | {v['req_s']:.1f} | "
                  f"{v['tok_s']:.0f} | not reported |")  # fmt: skip
        n = ns.max_requests
        for workers in (1, 2):
            k = _kvwatch(url, f"constant:rate=1000000#{n}", ns.output_len, workers)
            print(
                f"| {n} at once | kvwatch, {workers} process(es) | "
                f"{k['request_throughput']:.1f} | {k['output_token_throughput']:.0f} | - |"
            )
        v = _vllm(url, "inf", n, ns.output_len)
        print(f"| {n} at once | vllm bench serve | {v['req_s']:.1f} | {v['tok_s']:.0f} | - |")


if __name__ == "__main__":
    main()
