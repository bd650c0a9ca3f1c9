"""The load generator against `vllm bench serve` at H100 scale: both drive the same GPU twin.

One twin (`--twin MODEL:GPU:KV_BYTES`, time scale 1) serves two loads, each sent by kvwatch and
then by `vllm bench serve`, one tool after the other, each client pinned to core 1 (`taskset`):

- closed loop: `--streams` concurrent streams (kvwatch `--concurrency`; vLLM's
  `--max-concurrency` with `--request-rate inf`), for `--seconds`; vLLM's tool sends as many
  requests as kvwatch completed;
- open loop: Poisson arrivals at the twin's capacity, the request rate kvwatch's closed loop
  measured, for `--seconds`.

Per run: what each tool measured (req/s, output tokens/s, TTFT, ITL), kvwatch's own timing report
(dispatch lag: sent minus scheduled), and what the twin counted over the run (preemptions from
vLLM's `/metrics`, the twin's time behind the simulated card). Results: docs/benchmarks.md.

    PYTHONPATH=. .venv/bin/python bench/bench_loadgen_twin.py \
        --twin llama-3.1-8b:h100:34359738368 --streams 256 --seconds 60
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

import httpx
from twins import twin_from_spec

from kvwatch.local.tiny_model import build_tiny_model

HERE = Path(__file__).resolve().parent
CLIENT_CORE = "1"
_COUNTERS = ("vllm:num_preemptions_total", "kvwatch_twin_behind_seconds_total")


def _counters(base: str) -> dict[str, float]:
    """The twin's counters this bench differences over a run."""
    totals = dict.fromkeys(_COUNTERS, 0.0)
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        for name in _COUNTERS:
            if line.startswith(name) and line[len(name)] in " {":
                totals[name] += float(line.rpartition(" ")[2])
    return totals


def _kvwatch(base: str, load: list[str], lens: tuple[int, int], tmp: Path) -> dict[str, Any]:
    run_dir = tmp / f"kvwatch-{len(list(tmp.iterdir()))}"
    cmd = ["taskset", "-c", CLIENT_CORE, sys.executable, "-m", "kvwatch", "loadgen", "run",
           "--url", base, "--run-dir", str(run_dir), "--no-progress", "--json", "--seed", "1",
           "--input-len", str(lens[0]), "--output-len", str(lens[1]), *load]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"kvwatch loadgen run failed ({p.returncode}): {p.stderr[-2000:]}")
    o = json.loads(p.stdout)["overall"]
    return {
        "completed": o["completed"], "failed": o["failed"], "seconds": o["duration_s"],
        "req_s": o["request_throughput"], "tok_s": o["output_token_throughput"],
        "ttft_p50": o["ttft"]["p50"], "ttft_p99": o["ttft"]["p99"],
        "itl_p50": o["itl"]["p50"], "itl_p99": o["itl"]["p99"],
        "lag_p50": o["dispatch_lag"]["p50"], "lag_p99": o["dispatch_lag"]["p99"],
        "caveat": "yes" if "dispatch lag p99" in p.stderr else "no",
    }  # fmt: skip


def _vllm(base: str, model: str, load: list[str], n: int, lens: tuple[int, int], tmp: Path
          ) -> dict[str, Any]:  # fmt: skip
    out = tmp / f"vllm-{len(list(tmp.iterdir()))}.json"
    cmd = ["taskset", "-c", CLIENT_CORE, sys.executable, str(HERE / "vllm_bench_serve.py"),
           "--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions",
           "--model", model, "--tokenizer", str(build_tiny_model()), "--dataset-name", "random",
           "--random-input-len", str(lens[0]), "--random-output-len", str(lens[1]),
           "--ignore-eos", "--num-prompts", str(n), "--seed", "1", "--disable-tqdm",
           "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(tmp), "--result-filename", out.name,
           *load]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not out.exists():
        raise SystemExit(f"vllm bench serve failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(out.read_text())
    return {
        "completed": r["completed"], "failed": r.get("failed", n - r["completed"]),
        "seconds": r["duration"], "req_s": r["request_throughput"],
        "tok_s": r["output_throughput"],
        "ttft_p50": r["p50_ttft_ms"] / 1e3, "ttft_p99": r["p99_ttft_ms"] / 1e3,
        "itl_p50": r["p50_itl_ms"] / 1e3, "itl_p99": r["p99_itl_ms"] / 1e3,
        "lag_p50": None, "lag_p99": None, "caveat": "not reported",
    }  # fmt: skip


def _measured(base: str, run: Any) -> dict[str, Any]:
    """A run's own figures, plus what the twin counted while it ran."""
    before = _counters(base)
    row: dict[str, Any] = run()
    after = _counters(base)
    row["preemptions"] = int(after[_COUNTERS[0]] - before[_COUNTERS[0]])
    row["behind_share"] = (after[_COUNTERS[1]] - before[_COUNTERS[1]]) / max(row["seconds"], 1e-9)
    return row


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _print_row(load: str, tool: str, r: dict[str, Any]) -> None:
    print(f"| {load} | {tool} | {r['completed']}/{r['completed'] + r['failed']} | "
          f"{r['req_s']:.2f} | {r['tok_s']:,.0f} | {_ms(r['ttft_p50'])} / {_ms(r['ttft_p99'])} | "
          f"{_ms(r['itl_p50'])} / {_ms(r['itl_p99'])} | {_ms(r['lag_p50'])} / "
          f"{_ms(r['lag_p99'])} ({r['caveat']}) | {r['preemptions']} | "
          f"{r['behind_share'] * 100:.2f}% |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--twin", required=True, metavar="MODEL:GPU:KV_BYTES")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--input-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=300)
    ap.add_argument("--save", type=Path, help="write the rows as JSON here too")
    ns = ap.parse_args()
    lens = (ns.input_len, ns.output_len)
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    rows: list[dict[str, Any]] = []
    try:
        with twin_from_spec(ns.twin, tmp / "vllm.log") as twin:
            base = twin.base_url
            model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
            print(f"twin: {ns.twin}; {twin.capacity_line()}; {lens[0]} + {lens[1]} tokens")
            print("| load | tool | done/sent | req/s | output tok/s | TTFT p50 / p99 ms | "
                  "ITL p50 / p99 ms | dispatch lag p50 / p99 ms (caveat) | preemptions | "
                  "twin behind |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|---|")
            closed = f"closed, {ns.streams} streams"
            k = _measured(base, lambda: _kvwatch(
                base, ["--concurrency", str(ns.streams), "--duration", f"{ns.seconds:g}"],
                lens, tmp))  # fmt: skip
            _print_row(closed, "kvwatch loadgen run", k)
            rows.append({"load": closed, "tool": "kvwatch"} | k)
            n = k["completed"] + k["failed"]
            v = _measured(base, lambda: _vllm(
                base, model, ["--max-concurrency", str(ns.streams), "--request-rate", "inf"],
                n, lens, tmp))  # fmt: skip
            _print_row(closed, "vllm bench serve", v)
            rows.append({"load": closed, "tool": "vllm bench serve"} | v)
            rate = k["req_s"]
            opened = f"Poisson {rate:.2f}/s"
            k = _measured(
                base,
                lambda: _kvwatch(
                    base, ["--stage", f"poisson:rate={rate:.3f}@{ns.seconds:g}s"], lens, tmp
                ),
            )
            _print_row(opened, "kvwatch loadgen run", k)
            rows.append({"load": opened, "tool": "kvwatch"} | k)
            v = _measured(base, lambda: _vllm(
                base, model, ["--request-rate", f"{rate:.3f}"], int(rate * ns.seconds), lens,
                tmp))  # fmt: skip
            _print_row(opened, "vllm bench serve", v)
            rows.append({"load": opened, "tool": "vllm bench serve"} | v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if ns.save:
        ns.save.parent.mkdir(parents=True, exist_ok=True)
        ns.save.write_text(json.dumps({"twin": ns.twin, "streams": ns.streams,
                                       "seconds": ns.seconds, "lens": lens, "rows": rows},
                                      indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
