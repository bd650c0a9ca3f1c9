"""Walk vLLM's model registry: kvwatch's arithmetic against vLLM's own layer specs.

    PYTHONPATH=. .venv/bin/python bench/bench_arch_sweep.py            # all (about 4 min here)
    PYTHONPATH=. .venv/bin/python bench/bench_arch_sweep.py --only A B # some architectures

Writes bench/results/arch-sweep.json (one row per architecture: its class, what the arithmetic
said, what the vLLM path said) and prints the coverage table that docs/sizing.md carries.
bench/arch_sweep.py says what each class means.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from arch_sweep import CLASSES, Row, rows_to_json, sweep

OUT = Path(__file__).parent / "results" / "arch-sweep.json"


def table(version: str, rows: list[Row]) -> str:
    base = sum(" [" not in r.architecture for r in rows)
    lines = [
        f"vLLM {version}: {base} text architectures and {len(rows) - base} variants; "
        + ", ".join(f"{c} {sum(r.cls == c for r in rows)}" for c in CLASSES),
        "",
        "| architecture | class | kvwatch arithmetic | vLLM's specs (the `--layers vllm` path) |",
        "|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (CLASSES.index(r.cls), r.architecture)):
        said = r.arithmetic.split(";")[0].replace("|", "/")[:90]
        path = r.vllm_path.replace("|", "/")[:110]
        cls = r.cls + (f" ({r.detail})" if r.detail else "")
        lines.append(f"| {r.architecture} | {cls} | {said} | {path} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="these architectures only (not written)")
    ap.add_argument("--workers", type=int, default=2)
    ns = ap.parse_args()
    t0 = time.monotonic()
    version, rows = sweep(ns.workers, ns.only)
    print(table(version, rows))
    print(f"\n{time.monotonic() - t0:.0f} s", file=sys.stderr)
    if ns.only is None:
        OUT.write_text(json.dumps(rows_to_json(version, rows), indent=1) + "\n")
        print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
