"""The twin's step model against published vLLM step times, and its own figures where none is
published (decode at batch 1, 32 and 256 over 1,152 tokens of context; a 1,500-token prefill).
Pure arithmetic: prints docs/twin.md's tables and writes bench/results/twin/steptime.json.

    PYTHONPATH=. .venv/bin/python bench/bench_twin_steptime.py
"""

from __future__ import annotations

import json
from pathlib import Path

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.steptime import ScheduledRequest, StepModel
from tests.twin.published import PUBLISHED

OUT = Path(__file__).parent / "results" / "twin" / "steptime.json"


def main() -> None:
    rows = []
    print("| step | card | published | twin | diff | fitted | source |")
    print("|---|---|---|---|---|---|---|")
    for p in PUBLISHED:
        t = StepModel(lookup_model(p.model), lookup_gpu(p.gpu)).seconds(list(p.batch))
        diff = t / p.seconds - 1
        rows.append(dict(name=p.name, gpu=p.gpu, published_s=p.seconds, twin_s=t, diff=diff,
                         fitted=p.fitted, source=p.source))  # fmt: skip
        print(
            f"| {p.name} | {p.gpu} | {p.seconds * 1e3:.1f} ms | {t * 1e3:.1f} ms | "
            f"{diff:+.0%} | {'fit' if p.fitted else 'held out'} | {p.source} |"
        )
    own = []
    print()
    print("| card | decode b1 | b32 | b256 | prefill 1,500 |")
    print("|---|---|---|---|---|")
    for gpu in ("a100-40gb", "a100", "h100", "h200", "b200"):
        m = StepModel(lookup_model("llama-3.1-8b"), lookup_gpu(gpu))
        d = {b: m.seconds([ScheduledRequest(1, 1152)] * b) for b in (1, 32, 256)}
        pf = m.seconds([ScheduledRequest(1500, 1500)])
        own.append(dict(gpu=gpu, decode_s=d, prefill_1500_s=pf))
        print(
            f"| {gpu} | {d[1] * 1e3:.1f} ms ({1 / d[1]:.0f} tok/s) | {d[32] * 1e3:.1f} ms | "
            f"{d[256] * 1e3:.1f} ms ({256 / d[256]:,.0f} tok/s) | {pf * 1e3:.0f} ms |"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"published": rows, "model": own}, indent=2) + "\n")


if __name__ == "__main__":
    main()
