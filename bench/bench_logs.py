"""Log lines per second on a realistic vLLM log (`kvwatch logs` and the sidecar's reader).

The log is built from real lines of the fixture server: access-log lines (completions and
/metrics scrapes) with one periodic stats line per `--stats-every` lines (vLLM prints one per
engine per interval, 10 s by default, while hundreds of access lines go by).

    .venv/bin/python bench/bench_logs.py [--lines 1000000] [--stats-every 50]
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from kvwatch.sidecar.logs.logformats import parse_line, parse_text

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-0.32-cpu-server.log"


def build_log(n: int, stats_every: int) -> str:
    lines = DATA.read_text().splitlines(keepends=True)
    access = itertools.cycle([x for x in lines if '"POST /v1/' in x or '"GET /metrics' in x])
    stats = itertools.cycle([x for x in lines if "KV cache usage:" in x])
    return "".join(next(stats) if i % stats_every == 0 else next(access) for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--stats-every", type=int, default=50)
    ns = ap.parse_args()
    text = build_log(ns.lines, ns.stats_every)
    t0 = time.perf_counter()
    events = sum(1 for _ in parse_text(text))
    bulk = time.perf_counter() - t0
    lines = text.splitlines()
    t0 = time.perf_counter()
    per_line = sum(1 for x in lines if parse_line(x) is not None)
    live = time.perf_counter() - t0
    assert per_line == events
    print(f"{ns.lines:,} lines ({len(text) / 1e6:.0f} MB), {events:,} events")
    print(f"bulk (kvwatch logs):        {ns.lines / bulk / 1e6:5.2f} M lines/s")
    print(f"line by line (sidecar):     {ns.lines / live / 1e6:5.2f} M lines/s")


if __name__ == "__main__":
    main()
