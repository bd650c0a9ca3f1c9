"""The sizing advice proven at H100 scale, on the twin, the way bench/bench_sizing_levers.py
proves it on the fixture.

For each configuration: run a closed loop past the KV onset on the twin (vLLM 0.32's engine on a
simulated card, time scale 1), ask `kvwatch advise --run` for the levers, restart the twin with
each advised setting (more KV memory, --max-num-active-seqs, --max-num-seqs, TP 2 with the same
memory per GPU) and rerun the same seeded load; then bisect the smallest KV memory that ends
the preemption, as bench/bench_sizing_sliding.py does on the fixture. Writes
bench/results/twin/advice.json and prints docs/sizing.md's table.

    PYTHONPATH=. .venv/bin/python bench/bench_advice_twin.py [NAME ...]   # ~15 min each
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvwatch.loadgen.results.rundir import run_outcome
from kvwatch.twin.serve import start_twin

OUT = Path(__file__).resolve().parent / "results" / "twin" / "advice.json"
BISECT_STEPS = 3


@dataclass(frozen=True)
class Config:
    name: str
    model: str
    gpu: str
    kv_cache_memory_bytes: int
    bytes_per_block: int
    streams: int  # past the onset the what-if predicts
    prompt_len: int
    output_len: int

    def workload(self) -> list[str]:
        n = self.streams
        return [
            "--concurrency", str(n), "--requests", str(2 * n), "--seed", "9",
            "--input-len", str(self.prompt_len), "--output-len", str(self.output_len),
        ]  # fmt: skip


CONFIGS = [
    # onset 86 (bench_whatif_load.py): 128 streams preempt
    Config("llama8b-h100", "llama-3.1-8b", "h100", 8000 * 16 * 131072, 16 * 131072, 128, 1000, 500),
    # onset 162: 240 streams preempt
    Config("gptoss120b-h200", "gpt-oss-120b", "h200", 14 * 2**30, 589824, 240, 2000, 400),
]


def _run(c: Config, work: Path, label: str, kv: int, tp: int = 1, *extra: str) -> dict[str, Any]:
    """The load on a fresh twin with these settings: its outcome and vLLM's capacity line."""
    run_dir = work / label
    log = work / f"{label}-vllm.log"
    with start_twin(
        c.model, c.gpu, log, tp=tp, time_scale=1.0, status_dir=work,
        vllm_args=("--max-model-len", "4096", "--kv-cache-memory-bytes", str(kv), *extra),
    ) as twin:  # fmt: skip
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
             "--run-dir", str(run_dir), "--no-progress", *c.workload()],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if p.returncode != 0:
            raise SystemExit(f"{c.name} {label}: the load failed: {p.stderr[-2000:]}")
        line = twin.capacity_line()
    out: dict[str, Any] = dict(run_outcome(run_dir), setting=label, capacity_line=line)
    print(f"{c.name} {label}: {out}", file=sys.stderr, flush=True)
    return out


def _advice(c: Config, run_dir: Path) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--run", str(run_dir), "--model", c.model,
         "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if p.returncode != 1:  # undersized
        raise SystemExit(f"{c.name}: advise said {p.returncode}: {p.stdout[-500:]}{p.stderr}")
    (item,) = json.loads(p.stdout)
    advice: dict[str, Any] = item["advice"]
    return advice


def _prove(c: Config) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvwatch-advice-twin-") as tmp:
        work = Path(tmp)
        before = _run(c, work, "before", c.kv_cache_memory_bytes)
        advice = _advice(c, work / "before")
        kv = int(advice["kv_cache_memory_bytes"])
        n = int(advice["max_num_seqs"])
        flag = advice["concurrency_flag"]
        rows = [before, _run(c, work, f"--kv-cache-memory-bytes {kv}", kv)]
        for f in dict.fromkeys((flag, "--max-num-seqs")):
            rows.append(_run(c, work, f"{f} {n}", c.kv_cache_memory_bytes, 1, f, str(n)))
        rows.append(
            _run(c, work, "--tensor-parallel-size 2", c.kv_cache_memory_bytes, 2)
        )  # the same KV memory on each of two GPUs
        # the smallest memory that ends the preemption, in whole blocks
        lo, hi = c.kv_cache_memory_bytes // c.bytes_per_block, kv // c.bytes_per_block
        if rows[1]["preemptions"] > 0:
            hi = None  # the advice did not end it: nothing to bisect below it
        bisect = []
        for _ in range(BISECT_STEPS if hi is not None else 0):
            assert hi is not None
            mid = (lo + hi) // 2
            o = _run(c, work, f"bisect {mid} blocks", mid * c.bytes_per_block)
            bisect.append(dict(o, blocks=mid))
            if o["preemptions"] > 0:
                lo = mid
            else:
                hi = mid
    return {
        "config": asdict(c),
        "advice": {k: advice.get(k) for k in ("kv_cache_memory_bytes", "max_num_seqs",
                                                "concurrency_flag", "advised_for", "options")},
        "rows": rows,
        "bisect": bisect,
        "smallest_clean_blocks": hi,
        "advised_blocks": kv // c.bytes_per_block,
    }  # fmt: skip


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model x GPU | setting (as advised) | preemptions | output tok/s | e2e p99 "
        "| stalls (preempting) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["config"]
        base = r["rows"][0]
        for o in r["rows"]:
            ratio = o["output_token_throughput"] / base["output_token_throughput"]
            lines.append(
                f"| {c['model']} {c['gpu'].upper()}, {c['streams']} streams | `{o['setting']}` "
                f"| {o['preemptions']:.0f} | {o['output_token_throughput']:,.0f} ({ratio:.2f}x) "
                f"| {o['e2e_p99']:.1f} s | {o['stalls']:.0f} ({o['stalls_preempting']:.0f}) |"
            )
    lines.append("")
    for r in results:
        c, small, adv = r["config"], r["smallest_clean_blocks"], r["advised_blocks"]
        if small:
            lines.append(
                f"- {c['model']}: advised {adv:,} blocks; the smallest that ended the "
                f"preemption (bisected, {len(r['bisect'])} runs) {small:,}: the advice is "
                f"{adv / small - 1:+.0%} above it"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="configurations (default: all)")
    ns = ap.parse_args()
    done = json.loads(OUT.read_text()) if OUT.exists() else {}
    for c in CONFIGS:
        if not ns.names or c.name in ns.names:
            done[c.name] = _prove(c)
            OUT.write_text(json.dumps(done, indent=1) + "\n")
    print(_table(list(done.values())))


if __name__ == "__main__":
    main()
