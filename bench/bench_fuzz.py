"""10^5 fuzz cases per target, with plain random mutations of real vLLM output, traces,
Prometheus answers, a sidecar's documents and a server's answers to the load generator: how
many crash (raise) or break a property. The same properties as tests/test_fuzz.py
(tests/fuzzing.py).

    PYTHONPATH=. .venv/bin/python bench/bench_fuzz.py [--cases 100000] [--seed 1] [--only traces]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvwatch.sidecar.judge.prefix_curve import PrefixCurve
from tests.fuzzing import (
    LOG_LINES,
    METRIC_LINES,
    check_exposition,
    check_kv_event_batch,
    check_kv_recording,
    check_log_line,
    check_prometheus_answers,
    check_prometheus_calibration,
    check_run_dir,
    check_server_answers,
    check_sidecar_readings,
    check_sidecar_state,
    check_splitter,
    check_streamed_answer,
    check_trace,
    mutate,
    sse_response,
    trace_text,
)

_TMP = Path(tempfile.mkdtemp(prefix="kvwatch-fuzz-"))


def _metrics(rng: random.Random) -> None:
    lines = rng.sample(METRIC_LINES, rng.randint(1, min(40, len(METRIC_LINES))))
    check_exposition([mutate(line, rng) if rng.random() < 0.5 else line for line in lines])


def _log(rng: random.Random) -> None:
    check_log_line(mutate(rng.choice(LOG_LINES), rng))


def _splitter(rng: random.Random) -> None:
    data = mutate("\n".join(rng.sample(LOG_LINES, 3)), rng).encode("utf-8", "replace")
    check_splitter(data, [rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 8))])


def _trace(rng: random.Random) -> None:
    fmt = rng.choice(["mooncake", "azure", "kvwatch"])
    path = _TMP / f"trace.{'csv' if fmt == 'azure' else 'jsonl'}"
    path.write_text(trace_text(fmt, rng))
    check_trace(path, fmt if rng.random() < 0.5 else None, rng.choice([1.0, 2.0, 1e-300, 1e300]),
                rng.choice([1.0, 0.25, 1e-6, 1e6]))  # fmt: skip


def _streamed(rng: random.Random) -> None:
    raw = sse_response(rng)
    cuts = [rng.randrange(len(raw) + 1) for _ in range(rng.randint(0, 12))]
    check_streamed_answer(raw, cuts, rng.random() < 0.5)


_KV_CURVE = PrefixCurve(max_keys=64)


def _kv_events(rng: random.Random) -> None:
    check_kv_event_batch(rng, _KV_CURVE)


def _run_dir(rng: random.Random) -> None:
    check_run_dir(rng, _TMP)


TARGETS: dict[str, Callable[[random.Random], None]] = {
    "metrics (parse, observe, judge, export)": _metrics,
    "log lines": _log,
    "line splitter": _splitter,
    "traces (three formats, read and planned)": _trace,
    "Prometheus answers (advise --prometheus)": check_prometheus_answers,
    "another sidecar's /api/state (advise --sidecar)": check_sidecar_state,
    "Prometheus range answers (calibrate --prometheus)": check_prometheus_calibration,
    "a sidecar's /api/readings (calibrate --sidecar)": check_sidecar_readings,
    "a streamed completion (HTTP/1.1, SSE, chunk JSON)": _streamed,
    "/v1/models, /tokenize, /version answers": check_server_answers,
    "an edited run directory (report, advise --run, calibrate --run)": _run_dir,
    "vLLM's KV event batches (sidecar --kv-events)": _kv_events,
    "a run's KV event recording (advise --run)": lambda rng: check_kv_recording(rng, _TMP),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default="", help="targets whose name holds this (default: all)")
    ns = p.parse_args()
    for name, target in TARGETS.items():
        if ns.only.lower() not in name.lower():
            continue
        rng, broken, t0 = random.Random(ns.seed), 0, time.monotonic()
        first = ""
        for _ in range(ns.cases):
            try:
                target(rng)
            except Exception as e:  # noqa: BLE001 (counted: the point of the bench)
                broken += 1
                first = first or f"{type(e).__name__}: {str(e)[:200]}"
        took = time.monotonic() - t0
        print(f"{name}: {ns.cases:,} cases, {broken} crashed or broke a property, {took:.0f} s")
        if first:
            print(f"  first: {first}")


if __name__ == "__main__":
    main()
