"""How long a big trace takes to read, and how much memory, whole and for a short window.

    PYTHONPATH=. .venv/bin/python bench/bench_trace_read.py [--mb 100]

Writes a Mooncake-style JSONL file of about `--mb` MB (rows 2.3 ms apart, 20-block hash_ids,
as Mooncake's are), then reads and plans its replay in a fresh process each time (the
command's own path: `TraceReplay.plan`), once whole and once for a 60 s `--trace-window`, and
prints each one's seconds and peak memory (max RSS). Results: docs/loadgen.md.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = """
import sys
from pathlib import Path
from kvwatch.loadgen.workload.trace import TraceReplay
window = None if sys.argv[2] == "-" else tuple(float(x) for x in sys.argv[2].split(":"))
trace, plan = TraceReplay(Path(sys.argv[1]), window_s=window, max_requests=20).plan()
print(len(trace.requests), trace.outside_window, len(plan.requests))
"""


def _write(path: Path, mb: int) -> int:
    rng = random.Random(1)
    rows = 0
    with path.open("w") as f:
        while f.tell() < mb * 10**6:
            ids = [rng.randrange(10**6) for _ in range(20)]
            row = {"timestamp": rows * 2.3, "input_length": 20 * 512 - rng.randrange(512),
                   "output_length": rng.randrange(1, 600), "hash_ids": ids}  # fmt: skip
            f.write(json.dumps(row) + "\n")
            rows += 1
    return rows


def _timed(path: Path, window: str) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _CHILD, str(path), window], capture_output=True,
                       text=True, check=True)  # fmt: skip
    took = time.monotonic() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return took, max(peak, before) / 1024, p.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        rows = _write(path, ns.mb)
        print(f"{path.stat().st_size / 1e6:.0f} MB, {rows:,} rows")
        # the short window first: max RSS of children only grows, so the whole read is last
        for name, window in (("60 s window", "100:160"), ("whole", "-")):
            took, peak, said = _timed(path, window)
            kept, outside, planned = said.split()
            print(f"  {name}: {took:.1f} s, peak {peak:.0f} MB; {kept} rows read, {outside} "
                  f"counted outside the window, {planned} planned")  # fmt: skip


if __name__ == "__main__":
    main()
