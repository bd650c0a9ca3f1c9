"""Start-up time of the `kvwatch` command, as a whole process (docs/install.md's table).

Each command runs `--runs` times after one warm-up run; the median, minimum and maximum wall
time are printed. `kvwatch` is this checkout's (the editable install in .venv) unless
`--kvwatch PATH` names another (a wheel installed elsewhere).

    .venv/bin/python bench/bench_startup.py [--runs 10] [--kvwatch .venv/bin/kvwatch]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "data" / "vllm-0.32-cpu-server.log"


def timed(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, capture_output=True, check=False)  # warm the page cache
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--kvwatch", default=str(Path(sys.executable).with_name("kvwatch")))
    ns = ap.parse_args()
    head = "".join(LOG.read_text().splitlines(keepends=True)[:100])
    log = Path("/tmp/kvwatch-bench-startup.log")
    log.write_text(head)
    cases = {
        "kvwatch --version": [ns.kvwatch, "--version"],
        "kvwatch --help": [ns.kvwatch, "--help"],
        "kvwatch logs on a 100-line vLLM log": [ns.kvwatch, "logs", str(log)],
    }
    print(f"{'command':40} {'median':>8} {'min':>8} {'max':>8}  ({ns.runs} runs)")
    for name, cmd in cases.items():
        t = timed(cmd, ns.runs)
        print(
            f"{name:40} {statistics.median(t) * 1e3:7.0f}ms {min(t) * 1e3:7.0f}ms "
            f"{max(t) * 1e3:7.0f}ms"
        )
    log.unlink()


if __name__ == "__main__":
    main()
