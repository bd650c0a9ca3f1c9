"""Every kvwatch model preset on the twin against `kvwatch advise --what-if`: vLLM's own planner
over vLLM's own model classes built on the meta device, one process, no server (about half a
minute). CI keeps seven representative configurations (tests/twin/test_capacity.py); this runs
all 23 presets and writes bench/results/twin/capacity.json. Exit 1 on any difference.

    PYTHONPATH=. .venv/bin/python bench/bench_twin_capacity.py [--gpu h200] [--kv-gib 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvwatch.advise.whatif import what_if
from kvwatch.cli import build_parser
from kvwatch.sizing.presets import MODEL_PRESETS
from tests.twin.probe import run_probe

OUT = Path(__file__).parent / "results" / "twin" / "capacity.json"
FIELDS = ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "capacity_line")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--kv-gib", type=float, default=8.0)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=OUT)
    ns = ap.parse_args()
    kv = int(ns.kv_gib * 2**30)
    vllm = {"max_model_len": ns.max_model_len, "kv_cache_memory_bytes": kv}
    cases = [{"id": m, "model": m, "gpu": ns.gpu, "vllm": vllm} for m in MODEL_PRESETS]
    twin = run_probe(cases)
    rows, bad = [], 0
    print("| preset | blocks | block | vLLM's capacity line on the twin | what-if |")
    print("|---|---|---|---|---|")
    for m in MODEL_PRESETS:
        flags = ["--max-model-len", str(ns.max_model_len), "--kv-cache-memory-bytes", str(kv)]
        args = ["advise", "--what-if", "--model", m, "--gpu", ns.gpu, *flags]
        w = what_if(build_parser().parse_args(args)).to_dict()
        t = twin[m]
        same = "error" not in t and all(t[f] == w[f] for f in FIELDS)
        bad += not same
        rows.append({"preset": m, "twin": t, "what_if": {f: w[f] for f in FIELDS}, "equal": same})
        print(
            f"| {m} | {t.get('num_gpu_blocks')} | {t.get('block_size')} | "
            f"{t.get('capacity_line') or t.get('error')} | {'equal' if same else 'DIFFERS'} |"
        )
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps({"gpu": ns.gpu, "kv_bytes": kv, "rows": rows}, indent=2) + "\n")
    print(f"{len(rows) - bad} of {len(rows)} presets equal the what-if")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
