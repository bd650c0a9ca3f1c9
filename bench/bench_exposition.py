"""Time to parse a real vLLM /metrics body: kvwatch's reader vs prometheus-client's text parser.

.venv/bin/python bench/bench_exposition.py [--repeat 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import OBSERVED

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-0.32-metrics-busy.txt"


def _time(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=300)
    ns = ap.parse_args()
    text = DATA.read_text()
    ours = _time(lambda: parse_exposition(text), ns.repeat)
    scrape = _time(lambda: parse_exposition(text, OBSERVED), ns.repeat)
    theirs = _time(lambda: list(text_string_to_metric_families(text)), max(20, ns.repeat // 10))
    print(f"input: {DATA.name}, {len(text):,} bytes, {text.count(chr(10)):,} lines")
    print(f"kvwatch parse_exposition:          {ours * 1e3:7.3f} ms (median)")
    print(f"  as a scrape: what observe() reads {scrape * 1e3:7.3f} ms (median)")
    print(f"prometheus_client text parser:     {theirs * 1e3:7.3f} ms (median)")
    print(f"speed-up: {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
