"""How far the step-time model moved since an earlier commit, at the benches' operating points.

    PYTHONPATH=. .venv/bin/python bench/steptime_drift.py [--since dabf393]

A bench recorded on the twin before the step model was refitted stands on the old model: its
throughput and its timings move by about what the step moved at the batch it ran. This checks
the commit `--since` out (git archive, its `kvwatch/` alone) and computes one decode step (every
request 1 new token at the context given) and two prefills with that commit's model and with
this checkout's, for the configurations the twin benches use. Results: docs/twin.md ("What the
refit moved").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = (("llama-3.1-8b", "h100", 1), ("gpt-oss-120b", "h200", 1),
           ("qwen3-30b-a3b", "h200", 1), ("llama-3.1-70b", "h100", 4))  # fmt: skip
DECODES = ((1, 1000), (8, 1000), (16, 1500), (32, 1500), (64, 1500), (128, 1500), (256, 1500))

# run in a child, against whichever kvwatch is first on its path (the step model moved from
# kvwatch/sizing to kvwatch/timing on 2026-12-05)
_CHILD = """
import json, sys
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
try:
    from kvwatch.sizing.steptime import ScheduledRequest as R, StepConstants, StepModel
except ImportError:
    from kvwatch.timing.steptime import ScheduledRequest as R, StepConstants, StepModel
configs, decodes = json.loads(sys.argv[1])
out = {}
for model, gpu, tp in configs:
    m = StepModel(resolve_model(model), lookup_gpu(gpu), tp, 1, "auto", StepConstants())
    row = {f"decode {b} x {c}": m.seconds([R(1, c)] * b) for b, c in decodes}
    row["prefill 2,048"] = m.seconds([R(2048, 2048)])
    row["prefill 8,192 + 64 decodes"] = m.seconds([R(8192, 8192)] + [R(1, 1500)] * 64)
    out[f"{model} {gpu} TP{tp}"] = row
print(json.dumps(out))
"""


def _steps(path: Path) -> dict[str, dict[str, float]]:
    arg = json.dumps([CONFIGS, DECODES])
    env = {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True,
                          env=env, cwd=path, check=True)  # fmt: skip
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", default="dabf393", help="the commit to compare with (dabf393: "
                    "the 2026-12-04 twin benches' model)")  # fmt: skip
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvwatch-drift-") as tmp:
        archive = subprocess.run(["git", "archive", ns.since, "kvwatch"], cwd=ROOT,
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        old = _steps(Path(tmp))
    new = _steps(ROOT)
    print(f"| configuration | step | {ns.since} | now | moved |")
    print("|---|---|---|---|---|")
    for config, rows in new.items():
        for name, s in rows.items():
            was = old[config][name]
            print(f"| {config} | {name} | {was * 1e3:.2f} ms | {s * 1e3:.2f} ms | "
                  f"{s / was - 1:+.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
