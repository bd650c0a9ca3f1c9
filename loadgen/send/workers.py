"""Split one run over several processes, for loads beyond what one core can send on time.

Each worker is a spawned process with its own event loop and clients. They agree on a start time
(unix), wait at a barrier before every stage, and send their share (see `runner.Share`); their
records come back with times relative to the common start, so they merge into one run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from typing import Any

from kvwatch.loadgen.results.records import StallRule
from kvwatch.loadgen.send.runner import RunOptions, Share, run_loop, run_stages
from kvwatch.loadgen.workload.schedule import Stage
from kvwatch.loadgen.workload.spec import WorkloadSpec

__all__ = ["run_in_workers"]

_START_MARGIN_S = 3.0  # spawned interpreters import httpx and pandas before the start


def _worker(
    index: int,
    count: int,
    barrier: Any,
    start_unix: float,
    stages: list[Stage],
    opts: RunOptions,
    workload: WorkloadSpec,
    stall: StallRule,
    out: Any,
) -> None:
    async def go() -> None:
        delay = start_unix - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        share = Share(index, count, barrier)
        result = await run_stages(
            stages,
            opts,
            workload.items(),
            share=share,
            conversations=workload.conversations(),
            probes=workload.probe_stream(),
        )
        # re-base this process's clock on the common start
        t0 = result.t0 - (result.start_unix - start_unix)
        out.put(
            (
                index,
                [r.to_dict(t0, stall) for r in result.records],
                [dict(e, t=e["t"] + result.t0 - t0) for e in result.events],
            )
        )

    run_loop(go())


def run_in_workers(
    count: int, stages: list[Stage], opts: RunOptions, workload: WorkloadSpec, stall: StallRule
) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """(start unix time, merged records, merged stage events)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(count)
    out = ctx.Queue()
    start_unix = time.time() + _START_MARGIN_S
    procs = [
        ctx.Process(
            target=_worker,
            args=(i, count, barrier, start_unix, stages, opts, workload, stall, out),
            daemon=True,
        )
        for i in range(count)
    ]
    for p in procs:
        p.start()
    parts = []
    try:
        for _ in range(count):
            parts.append(out.get())
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    records = sorted((r for _, recs, _ in parts for r in recs), key=lambda r: r["scheduled_at"])
    events: dict[tuple[str, str], dict[str, Any]] = {}
    for _, _, evs in parts:
        for e in evs:
            key = (e["event"], e["stage"])
            keep = min if e["event"] == "stage_start" else max
            if key not in events or keep(e["t"], events[key]["t"]) == e["t"]:
                events[key] = e
    return start_unix, records, sorted(events.values(), key=lambda e: e["t"])
