"""`kvwatch loadgen run`: drive a server with stages of load and write a run directory."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from kvwatch.loadgen.arrivals import Concurrency, Constant, Gamma, Pattern, Poisson, Ramp
from kvwatch.loadgen.client import served_model
from kvwatch.loadgen.records import StallRule
from kvwatch.loadgen.runner import Progress, RunOptions, run_loop, run_stages
from kvwatch.loadgen.schedule import Stage, StageSpecError, parse_stage, sweep_stages
from kvwatch.loadgen.server_metrics import TimelineRecorder, server_snapshot, sidecar_incidents
from kvwatch.loadgen.stall_causes import PreemptionCounter, mark_preempting_stalls
from kvwatch.loadgen.workload import DatasetError, WorkloadSpec, tokenize_corpus
from kvwatch.sidecar.command import EXIT_FOUND, EXIT_UNREACHABLE, CliError
from kvwatch.sidecar.timeline import COUNTERS, counter_increase

__all__ = ["run_command", "build_stages"]


def _single_pattern(ns: argparse.Namespace) -> Pattern | None:
    given = [x is not None for x in (ns.rate, ns.concurrency, ns.ramp)]
    if sum(given) > 1:
        raise CliError("use one of --rate, --concurrency, --ramp (or --stage/--sweep)")
    if ns.rate is not None:
        if ns.arrival == "constant":
            return Constant(ns.rate)
        if ns.arrival == "gamma":
            return Gamma(ns.rate, ns.burstiness)
        return Poisson(ns.rate)
    if ns.concurrency is not None:
        return Concurrency(ns.concurrency)
    if ns.ramp is not None:
        try:
            start, end = (float(x) for x in ns.ramp.split(","))
        except ValueError:
            raise CliError(f"--ramp wants START,END rates, got {ns.ramp!r}") from None
        return Ramp(start, end)
    return None


def build_stages(ns: argparse.Namespace) -> list[Stage]:
    try:
        pattern = _single_pattern(ns)
        if sum(bool(x) for x in (ns.stage, ns.sweep, pattern)) != 1:
            raise CliError(
                "give the load as --stage, --sweep, or one of --rate/--concurrency/--ramp"
            )
        if ns.stage:
            stages = [parse_stage(s) for s in ns.stage]
        elif ns.sweep:
            kind, sep, values = ns.sweep.partition("=")
            try:
                nums = [float(v) for v in values.split(",")]
            except ValueError:
                raise CliError(f"--sweep {ns.sweep!r}: numbers expected") from None
            stages = sweep_stages(kind, nums, ns.duration, ns.requests, ns.burstiness)
        else:
            assert pattern is not None
            stages = [Stage("main", pattern, ns.duration, ns.requests)]
        seen: dict[str, int] = {}
        for k, st in enumerate(stages):  # names key the records: keep them unique
            seen[st.name] = seen.get(st.name, 0) + 1
            if seen[st.name] > 1:
                stages[k] = replace(st, name=f"{st.name}#{seen[st.name]}")
        if ns.warmup > 0:
            stages.insert(0, Stage("warmup", stages[0].pattern, ns.warmup, None, warmup=True))
        return stages
    except (StageSpecError, ValueError) as e:
        raise CliError(str(e)) from None


async def _workload(ns: argparse.Namespace, client: httpx.AsyncClient, model: str) -> WorkloadSpec:
    spec = WorkloadSpec(
        input_len=ns.input_len,
        output_len=ns.output_len,
        seed=ns.seed,
        dataset=ns.dataset,
        shared_prefix=ns.shared_prefix,
        prefix_groups=ns.prefix_groups,
    )
    if ns.dataset is None:
        tok = await tokenize_corpus(client, ns.url, model, ns.seed)
        if tok is not None:
            spec = replace(spec, tokens=tuple(tok[0]))
    next(spec.items())  # bad lengths or a bad dataset fail here, before the run
    return spec


async def _progress(p: Progress, t0: float) -> None:
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


def _send(
    ns: argparse.Namespace,
    stages: list[Stage],
    opts: RunOptions,
    workload: WorkloadSpec,
    stall: StallRule,
    progress: Progress,
) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs the stages in this process or in worker processes; (start, records, events)."""
    if ns.workers > 1:
        from kvwatch.loadgen.workers import run_in_workers

        print(f"starting {ns.workers} sender processes ...", file=sys.stderr)
        start_unix, records, events = run_in_workers(ns.workers, stages, opts, workload, stall)
    else:

        async def go() -> Any:
            ticker = None
            if not ns.no_progress:
                ticker = asyncio.create_task(_progress(progress, time.perf_counter()))
            try:
                return await run_stages(stages, opts, workload.items(), progress)
            finally:
                if ticker:
                    ticker.cancel()

        result = run_loop(go())
        if not ns.no_progress:
            print(file=sys.stderr)
        start_unix, events = result.start_unix, result.events
        records = [r.to_dict(result.t0, stall) for r in result.records]
    return start_unix, records, events


def run_command(ns: argparse.Namespace) -> int:
    from kvwatch.loadgen.rundir import write_run
    from kvwatch.loadgen.summary import (
        SloError,
        parse_slo,
        render_table,
        summarize_records,
        timing_caveat,
    )

    stages = build_stages(ns)
    if not ns.request_timeout > 0:
        raise CliError(f"--request-timeout must be above 0 seconds, not {ns.request_timeout:g}")
    try:
        slo = parse_slo(ns.slo)
    except SloError as e:
        raise CliError(str(e)) from None
    api_key = os.environ.get(ns.api_key_env) or None
    progress = Progress()

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def prepare() -> tuple[str, WorkloadSpec, dict[str, Any] | None]:
        async with httpx.AsyncClient(timeout=10, headers=headers) as client:
            try:
                model = ns.model or await served_model(client, ns.url)
            except (httpx.HTTPError, ValueError, KeyError) as e:
                raise CliError(f"cannot reach {ns.url}: {e}", EXIT_UNREACHABLE) from None
            try:
                workload = await _workload(ns, client, model)
            except DatasetError as e:
                raise CliError(str(e)) from None
            return model, workload, await server_snapshot(client, ns.url)

    async def finish() -> dict[str, Any] | None:
        async with httpx.AsyncClient(timeout=10, headers=headers) as client:
            return await server_snapshot(client, ns.url)

    async def sidecar_end() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await sidecar_incidents(client, ns.sidecar)

    model, workload, server_before = run_loop(prepare())
    before_t = time.time()
    opts = RunOptions(
        ns.url,
        model,
        chat=ns.chat,
        ignore_eos=not ns.no_ignore_eos,
        seed=ns.seed,
        api_key=api_key,
        max_inflight=ns.max_inflight,
        request_timeout_s=ns.request_timeout,
        events_url=ns.sidecar,
    )
    stall = StallRule(ns.stall_factor, ns.stall_min)
    with TimelineRecorder(ns.url, ns.sidecar, headers) as recorder:
        start_unix, records, events = _send(ns, stages, opts, workload, stall, progress)
    after_t = time.time()
    server_after = run_loop(finish())
    # the snapshots close the timeline at both ends, so stalls at the edges can be judged too
    samples = [
        *([{"t": before_t, **server_before}] if server_before else []),
        *recorder.rows,
        *([{"t": after_t, **server_after}] if server_after else []),
    ]
    mark_preempting_stalls(records, PreemptionCounter.from_rows(samples), start_unix)
    summary = summarize_records(records, slo)
    if server_before and server_after:
        summary["server"] = _server_delta(server_before, server_after)
    if ns.sidecar:
        summary["sidecar"] = run_loop(sidecar_end())
    run_dir = ns.run_dir or Path("runs") / time.strftime("loadgen-%Y%m%d-%H%M%S")
    spec = {
        "target": ns.url,
        "model": model,
        "endpoint": "chat" if ns.chat else "completions",
        "start_unix": start_unix,
        "seed": ns.seed,
        "slo": slo,
        "workers": ns.workers,
        "stages": [
            {
                "name": s.name,
                "pattern": s.pattern,
                "duration_s": s.duration_s,
                "count": s.count,
                "warmup": s.warmup,
            }
            for s in stages
        ],
        "workload": workload.describe(),
        "ignore_eos": not ns.no_ignore_eos,
        "stall_rule": {"factor": stall.factor, "min_s": stall.min_s},
        "server_before": server_before,
        "server_after": server_after,
    }
    write_run(run_dir, spec, records, events, summary, recorder.rows)
    if ns.json:
        import json

        print(json.dumps(summary, indent=2))
    else:
        print(render_table(summary))
        print(f"run directory: {run_dir}")
    caveat = timing_caveat(summary)
    if caveat:
        print(f"kvwatch: warning: {caveat}", file=sys.stderr)
    return EXIT_FOUND if summary["overall"].get("failed") else 0


def _server_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the server counted during the run. Only two samples: across a restart it is what
    the server counted since the restart, a lower bound (the timeline's one reset rule)."""
    out: dict[str, Any] = {}
    for k in COUNTERS:
        a, b = before.get(k), after.get(k)
        out[k.removesuffix("_total")] = None if a is None or b is None else counter_increase(a, b)
    return out
