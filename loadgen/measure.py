"""One measured load: the server's counters before and after, its timeline during, the requests'
records with their stalls judged against the server's preemptions. `kvwatch loadgen run` runs
one; `kvwatch loadgen search` runs one per probe."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from kvwatch.loadgen.results.records import StallRule
from kvwatch.loadgen.results.server_metrics import TimelineRecorder, server_snapshot
from kvwatch.loadgen.results.stall_causes import (
    SampledCounter,
    ServerCounters,
    attribute_stalls,
    mark_preempting_stalls,
)
from kvwatch.loadgen.send.runner import Progress, run_loop
from kvwatch.loadgen.workload.arrivals import describe
from kvwatch.loadgen.workload.schedule import Stage
from kvwatch.loadgen.workload.spec import WorkloadSpec
from kvwatch.sidecar.judge.timeline import COUNTERS, counter_increase

__all__ = ["Measured", "measure", "print_progress", "server_delta", "run_spec", "snapshot_once"]

# (start unix time, request records, stage events): what sending a load gives back
Sent = tuple[float, list[dict[str, Any]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Measured:
    start_unix: float
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    server_before: dict[str, Any] | None
    server_after: dict[str, Any] | None

    def server_delta(self) -> dict[str, Any] | None:
        if self.server_before is None or self.server_after is None:
            return None
        return server_delta(self.server_before, self.server_after)


def snapshot_once(url: str | None, headers: dict[str, str]) -> dict[str, Any] | None:
    """One reading of the server's /metrics (None: no URL, or no vLLM metrics there)."""
    if url is None:
        return None

    async def snapshot() -> dict[str, Any] | None:
        async with httpx.AsyncClient(timeout=10, headers=headers) as client:
            return await server_snapshot(client, url)

    got: dict[str, Any] | None = run_loop(snapshot())
    return got


def measure(
    url: str | None, headers: dict[str, str], sidecar: str | None, send: Callable[[], Sent]
) -> Measured:
    """Snapshot the server, send the load with its timeline recorded, snapshot it again.
    `url` None: the server's /metrics is not read (a router in front, whose /metrics would
    be one replica's and whose policy would count each sample as a request)."""

    before = snapshot_once(url, headers)
    before_t = time.time()
    if url is None:
        start_unix, records, events = send()
        rows: list[dict[str, Any]] = []
    else:
        with TimelineRecorder(url, sidecar, headers) as recorder:
            start_unix, records, events = send()
        rows = recorder.rows
    after_t = time.time()
    after = snapshot_once(url, headers)
    # the snapshots close the timeline at both ends, so stalls at the edges can be judged too
    samples = [
        *([{"t": before_t, **before}] if before else []),
        *rows,
        *([{"t": after_t, **after}] if after else []),
    ]
    mark_preempting_stalls(records, SampledCounter.from_rows(samples), start_unix)
    attribute_stalls(records, ServerCounters(samples), start_unix)
    return Measured(start_unix, records, events, rows, before, after)


async def print_progress(p: Progress, t0: float) -> None:
    """The live progress line on stderr until cancelled: redrawn on a terminal, a line every
    5 s in a log."""
    tty = sys.stderr.isatty()
    period = 0.5 if tty else 5.0
    while True:
        await asyncio.sleep(period)
        el = time.perf_counter() - t0
        line = (
            f"[{el:6.1f}s] {p.stage}: sent {p.sent}, done {p.done}, in flight {p.inflight}, "
            f"errors {p.errors}, {p.output_tokens / el:.0f} tok/s"
        )
        print(
            ("\r" + line + "   ") if tty else line,
            end="" if tty else "\n",
            file=sys.stderr,
            flush=True,
        )


def server_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the server counted during the run. Only two samples: across a restart it is what
    the server counted since the restart, a lower bound (the timeline's one reset rule)."""
    out: dict[str, Any] = {}
    for k in COUNTERS:
        a, b = before.get(k), after.get(k)
        out[k.removesuffix("_total")] = None if a is None or b is None else counter_increase(a, b)
    return out


def run_spec(
    target: str,
    model: str,
    chat: bool,
    seed: int,
    slo: dict[str, float],
    workers: int,
    stages: list[Stage],
    workload: WorkloadSpec,
    ignore_eos: bool,
    stall: StallRule,
    measured: Measured,
    time_scale: float | None = None,
) -> dict[str, Any]:
    """The run directory's spec.json: what was sent to what, and the server before and after.
    `time_scale`: the target is a kvwatch twin stretching its card's time this many times; the
    records are wall seconds, and the stall rule and SLOs here are already in wall time."""
    return {
        "target": target,
        "model": model,
        "endpoint": "chat" if chat else "completions",
        "start_unix": measured.start_unix,
        "seed": seed,
        "slo": slo,
        "workers": workers,
        "stages": [
            {
                "name": s.name,
                "pattern": s.pattern,
                "label": describe(s.pattern),
                "duration_s": s.duration_s,
                "count": s.count,
                "warmup": s.warmup,
            }
            for s in stages
        ],
        "workload": workload.describe(),
        "ignore_eos": ignore_eos,
        "stall_rule": {"factor": stall.factor, "min_s": stall.min_s},
        "server_before": measured.server_before,
        "server_after": measured.server_after,
        "time_scale": time_scale,
    }
