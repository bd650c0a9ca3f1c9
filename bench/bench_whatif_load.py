"""The what-if's load prediction against what `kvwatch loadgen search` finds on the twin.

For each model x GPU x workload below: start the twin (vLLM 0.32's own engine on a simulated
card) with a KV budget that a realistic load outgrows, run `kvwatch loadgen search --by
concurrency` against it as a user would (closed-loop streams of fixed prompt and output
lengths, an SLO loose enough that only the KV onset binds), and keep its search.json and every
probe's run directory under bench/results/twin/whatif-load/NAME/. Then `kvwatch advise
--what-if` with the same flags predicts the onset (the lowest concurrency that preempts) and the
output tokens/s at the highest clean load and at the onset; the table compares.

    PYTHONPATH=. .venv/bin/python bench/bench_whatif_load.py run [NAME ...]   # minutes each
    PYTHONPATH=. .venv/bin/python bench/bench_whatif_load.py compare          # from the records

`compare` reads only what `run` recorded, so every figure can be recomputed; it writes
bench/results/twin/whatif_load.json and prints docs/sizing.md's table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "twin" / "whatif-load"
OUT = ROOT / "bench" / "results" / "twin" / "whatif_load.json"
TIME_SCALE = 1.0


@dataclass(frozen=True)
class Combo:
    name: str
    model: str
    gpu: str
    tp: int
    kv_cache_memory_bytes: int
    prompt_len: int
    output_len: int
    start: int  # the search's first concurrency
    max_load: int = 256  # the search's highest (it doubles up to here when no SLO fails)
    max_model_len: int = 4096
    time_scale: float = TIME_SCALE

    def what_if_args(self) -> list[str]:
        return [
            "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
            "--max-model-len", str(self.max_model_len),
            "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
            "--prompt-len", str(self.prompt_len), "--output-len", str(self.output_len),
        ]  # fmt: skip


COMBOS = [
    # the seed's case: 8,000 blocks of 16 (2 MiB each), 1,000 + 500 tokens
    Combo("llama8b-h100", "llama-3.1-8b", "h100", 1, 8000 * 16 * 131072, 1000, 500, 32),
    # sliding window + MoE: half the layers keep 128 tokens
    Combo("gptoss120b-h200", "gpt-oss-120b", "h200", 1, 14 * 2**30, 2000, 400, 32),
    # TP4: each rank holds a quarter of the KV heads
    Combo("llama70b-tp4-h100", "llama-3.1-70b", "h100", 4, 18 * 2**30, 1500, 500, 32, 128),
    # sliding window 5:1 (Gemma 3): prompts longer than its 1,024-token window
    Combo("gemma27b-h200", "gemma-3-27b", "h200", 1, 60 * 2**30, 1500, 300, 32, 128),
]


# the model's one choice (a window's prefill peak makes prompts wait, it does not move the onset)
# was made on these runs; the others were recorded after it
CHOSEN_ON = ("llama8b-h100", "gptoss120b-h200")


def _run(c: Combo) -> None:
    from kvwatch.twin.serve import start_twin

    dest = RESULTS / c.name
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory(prefix="kvwatch-whatif-load-") as tmp:
        log = Path(tmp) / "vllm.log"
        with start_twin(
            c.model, c.gpu, log, tp=c.tp, time_scale=c.time_scale,
            vllm_args=("--max-model-len", str(c.max_model_len),
                       "--kv-cache-memory-bytes", str(c.kv_cache_memory_bytes)),
            status_dir=Path(tmp),
        ) as twin:  # fmt: skip
            cmd = [
                sys.executable, "-m", "kvwatch", "loadgen", "search", "--url", twin.base_url,
                "--slo", "ttft=600s", "--by", "concurrency", "--start", str(c.start),
                "--max", str(c.max_load), "--repeats", "1", "--max-repeats", "1",
                "--input-len", str(c.prompt_len), "--output-len", str(c.output_len),
                "--run-dir", str(dest), "--json", "--no-progress",
            ]  # fmt: skip
            print(f"{c.name}: {twin.capacity_line()}", file=sys.stderr)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
            (dest / "capacity_line.txt").write_text(f"{twin.capacity_line()}\n")
            # the card's own counters: busy, and behind (waiting on this machine's CPU)
            metrics = httpx.get(f"{twin.base_url}/metrics", timeout=30).text
            (dest / "twin_metrics.txt").write_text(
                "".join(x + "\n" for x in metrics.splitlines() if x.startswith("kvwatch_twin_"))
            )


def _what_if(c: Combo, concurrency: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--what-if", *c.what_if_args(),
         "--concurrency", str(concurrency), "--json"],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    if out.returncode not in (0, 1):  # 1: the load is undersized, as it is past the onset
        raise SystemExit(f"{c.name}: the what-if failed: {out.stderr.strip()}")
    (item,) = json.loads(out.stdout)
    doc: dict[str, Any] = item["what_if"]
    return doc


def _throughput(dest: Path, probe: str) -> float | None:
    summary = json.loads((dest / "probes" / probe / "summary.json").read_text())
    o = summary["overall"]
    k = summary.get("time_scale") or 1.0
    tp = o.get("output_token_throughput")
    return None if tp is None else tp * k  # per simulated second


def _compare() -> list[dict[str, Any]]:
    rows = []
    for c in COMBOS:
        dest = RESULTS / c.name
        if not (dest / "twin_metrics.txt").exists():  # written once the search has ended
            print(f"{c.name}: no finished search recorded (run it first)", file=sys.stderr)
            continue
        search = json.loads((dest / "search.json").read_text())["result"]
        onset, clean = search["kv_onset"], search["kv_clean"]
        measured_onset = None if onset is None else int(onset["load"])
        predicted = _what_if(c, measured_onset or c.start)["load"]
        row: dict[str, Any] = {
            "name": c.name, "model": c.model, "gpu": c.gpu, "tp": c.tp,
            "prompt_len": c.prompt_len, "output_len": c.output_len,
            "num_gpu_blocks": predicted["num_gpu_blocks"],
            "predicted_onset": predicted["kv_onset_concurrency"],
            "measured_onset": measured_onset,
            "measured_clean": None if clean is None else int(clean["load"]),
        }  # fmt: skip
        for label, v in (("clean", clean), ("onset", onset)):
            if v is None:
                continue
            load = int(v["load"])
            p = _what_if(c, load)["load"]["at_concurrency"]
            m = _throughput(dest, v["probes"][0])
            row[f"{label}_tokens_per_s_predicted"] = p["output_tokens_per_s"]
            row[f"{label}_tokens_per_s_measured"] = m
        row["card_behind_share"] = _behind(dest)
        row["stalls"] = _stalls(dest)
        row["chosen_on"] = c.name in CHOSEN_ON
        rows.append(row)
    return rows


def _stalls(dest: Path) -> dict[str, int]:
    """The load generator's stalls over every probe, split by whether the probe preempted, and
    those of the preempting probes that came while the server preempted (loadgen's own
    attribution, loadgen/results/stall_causes.py)."""
    out = {"clean_probes_stalls": 0, "preempting_probes_stalls": 0, "stalls_preempting": 0}
    for summary_path in sorted((dest / "probes").glob("*/summary.json")):
        s = json.loads(summary_path.read_text())
        o = s["overall"]
        if ((s.get("server") or {}).get("preemptions") or 0) > 0:
            out["preempting_probes_stalls"] += int(o.get("stalls") or 0)
            out["stalls_preempting"] += int(o.get("stalls_preempting") or 0)
        else:
            out["clean_probes_stalls"] += int(o.get("stalls") or 0)
    return out


def _behind(dest: Path) -> float | None:
    """The share of the run the simulated card waited on this machine's CPU (its figures hold
    while this is near 0)."""
    values = {}
    for line in (dest / "twin_metrics.txt").read_text().splitlines():
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    sim = values.get("kvwatch_twin_simulated_seconds_total")
    behind = values.get("kvwatch_twin_behind_seconds_total")
    return None if not sim or behind is None else behind / sim


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model x GPU | workload | blocks | onset: what-if | onset: twin | diff "
        "| tok/s below onset: what-if | twin | diff | card behind |"
        "\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        po, mo = r["predicted_onset"], r["measured_onset"]
        d_on = "-" if not mo else f"{(po - mo) / mo:+.0%}"
        pt, mt = r.get("clean_tokens_per_s_predicted"), r.get("clean_tokens_per_s_measured")
        d_tp = "-" if not (pt and mt) else f"{(pt - mt) / mt:+.0%}"
        tp = f" TP{r['tp']}" if r["tp"] > 1 else ""
        name = f"{r['model']} {r['gpu'].upper()}{tp}" + ("" if r["chosen_on"] else " (held out)")
        lines.append(
            f"| {name} | {r['prompt_len']:,} + {r['output_len']:,} "
            f"| {r['num_gpu_blocks']:,} | {po} | {mo or '-'} | {d_on} "
            f"| {pt or 0:,.0f} | {mt or 0:,.0f} | {d_tp} | {r['card_behind_share'] or 0:.2%} |"
        )
    lines += [
        "",
        "| model x GPU | stalls, probes with no preemption | stalls, probes that preempted "
        "| of those, while it preempted |",
        "|---|---|---|---|",
    ]
    for r in rows:
        st = r["stalls"]
        n = st["preempting_probes_stalls"]
        share = f" ({st['stalls_preempting'] / n:.0%})" if n else ""
        lines.append(
            f"| {r['model']} {r['gpu'].upper()} | {st['clean_probes_stalls']:,} | {n:,} "
            f"| {st['stalls_preempting']:,}{share} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("run", "compare"))
    ap.add_argument("names", nargs="*", help="combinations to run (default: all)")
    ns = ap.parse_args()
    if ns.action == "run":
        for c in COMBOS:
            if not ns.names or c.name in ns.names:
                _run(c)
        return
    rows = _compare()
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()
