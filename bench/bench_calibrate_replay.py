"""`kvwatch calibrate --metrics` replayed on a twin run's recorded `/metrics`: a change to the
server path judged on the same readings, without a new run (issue #40).

`bench_calibrate.py twin` keeps its work folder: the scrapes it recorded beside the watch
(`scrapes.jsonl`, two a second) and the hidden constants (`hidden.json`). This reads them through
the sidecar's parser and `calibrate`'s own path (readings, slices, figures, the fit with the
server's loss) and prints each hidden constant's error; `--slice` tries other slice lengths,
`--out` keeps the results (bench/results/twin/calibrate-busy-spans.json). The folders are
40-50 MB each and stay in /tmp: rerun `bench_calibrate.py twin` to make one.

    PYTHONPATH=.:bench python bench/bench_calibrate_replay.py /tmp/kvwatch-calibrate-twin-XXXX
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvwatch.advise.calibrate import default_max_num_seqs
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe
from kvwatch.sidecar.metrics.twin import read_time_scale
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.calibration import SERVER_ROBUST, calibrate
from kvwatch.timing.server_slices import Reading, figures_from_slices, slices_from_readings


def readings(path: Path) -> tuple[dict[str, list[Reading]], float]:
    """Per engine its readings, in the twin's clock, as `calibrate --metrics` makes them."""
    out: dict[str, list[Reading]] = {}
    scale = 1.0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if not row["text"]:
            continue
        scale = read_time_scale(row["text"]) or scale
        for (model, engine), obs in observe(parse_exposition(row["text"])).items():
            name = f"{model or 'model'} engine {engine or '0'}"
            out.setdefault(name, []).append(obs.calibration_reading(row["t"] / scale, scale))
    return out, scale


def replay(work: Path, slice_s: float, model: str = "llama-3.1-8b", gpu_name: str = "h100",
           ) -> dict[str, Any]:  # fmt: skip
    hidden = json.loads((work / "hidden.json").read_text())
    per_engine, scale = readings(work / "scrapes.jsonl")
    arch, gpu = resolve_model(model), lookup_gpu(gpu_name)
    figures, notes = [], []
    for name, rs in per_engine.items():
        slices, skipped = slices_from_readings(rs, slice_s / scale)
        more, why = figures_from_slices(slices, gpu.batched_tokens, default_max_num_seqs(gpu))
        figures += more
        notes += [f"{name}: {w}" for w in skipped + why]
    cal = calibrate(arch, gpu, 1, "auto", figures, f"replay {work}", robust=SERVER_ROBUST)
    errors = {k: round(cal.constants[k] / v - 1, 4) for k, v in hidden.items()
              if k in cal.constants}  # fmt: skip
    return {"work": str(work), "hidden": hidden, "slice_s": slice_s,
            "figures": len(figures), "errors": errors,
            "not_pinned": cal.not_pinned, "fit_error": cal.error, "notes": notes,
            "rows": cal.figures}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path, nargs="+", help="bench_calibrate.py twin work folders")
    ap.add_argument("--slice", type=float, action="append",
                    help="slice seconds, wall (repeatable; default 3)")  # fmt: skip
    ap.add_argument("--rows", action="store_true", help="print every figure's error")
    ap.add_argument("--out", type=Path, help="write every replay's result here (JSON)")
    ns = ap.parse_args()
    results = []
    for work in ns.work:
        for slice_s in ns.slice or [3.0]:
            out = replay(work, slice_s)
            results.append(out)
            print(
                f"{work}, slices of {slice_s:g} s: {out['figures']} figures, fit {out['fit_error']}"
            )
            print("  " + ", ".join(f"{k} {v:+.1%}" for k, v in out["errors"].items())
              + (f"; not pinned: {out['not_pinned']}" if out["not_pinned"] else ""))  # fmt: skip
            for n in out["notes"]:
                print(f"  left out: {n}")
            if ns.rows:
                for r in out["rows"]:
                    print(f"  {r['error']:+7.1%}  {r['label']}")
    if ns.out:
        doc = {"date": time.strftime("%Y-%m-%d"), "replays": results}
        ns.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
