"""`kvwatch loadgen run`: drive a server with stages of load and write a run directory."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_UNREACHABLE, CliError, one_line
from kvwatch.loadgen.measure import measure, print_progress, run_spec
from kvwatch.loadgen.results.records import StallRule
from kvwatch.loadgen.results.replay_text import render_replay
from kvwatch.loadgen.results.server_metrics import sidecar_incidents
from kvwatch.loadgen.results.working_set import (
    render_working_set,
    session_working_set,
    working_set_advice,
)
from kvwatch.loadgen.send.client import max_model_len, served_model
from kvwatch.loadgen.send.runner import Progress, RunOptions, run_loop, run_stages
from kvwatch.loadgen.workload.arrivals import (
    Concurrency,
    Constant,
    Gamma,
    Pattern,
    Poisson,
    Ramp,
    Replay,
)
from kvwatch.loadgen.workload.priorities import parse_priorities
from kvwatch.loadgen.workload.probes import ProbeSpec
from kvwatch.loadgen.workload.schedule import Stage, StageSpecError, parse_stage, sweep_stages
from kvwatch.loadgen.workload.sessions import SessionShape
from kvwatch.loadgen.workload.spec import DatasetError, WorkloadSpec, tokenize_corpus
from kvwatch.loadgen.workload.trace import TraceError, TraceReplay, replay_report

__all__ = [
    "run_load",
    "server_metrics_url",
    "build_stages",
    "prepare_run",
    "send_stages",
    "announce_time_scale",
    "in_wall_time",
]


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


def _trace_replay(
    ns: argparse.Namespace, max_model_len: int | None = None, time_scale: float | None = None
) -> TraceReplay | None:
    """The replay `--trace` asks for (None without it); its arguments checked."""
    if getattr(ns, "trace", None) is None:
        return None
    window = None
    if ns.trace_window:
        try:
            lo, hi = (float(x) for x in ns.trace_window.split(":"))
        except ValueError:
            raise CliError(
                f"--trace-window wants START:END seconds, got {ns.trace_window!r}"
            ) from None
        window = (lo, hi)
    return TraceReplay(
        ns.trace, ns.trace_format, ns.trace_block_tokens, ns.trace_speed, window, ns.requests,
        ns.duration, ns.trace_length_scale, max_model_len, time_scale or 1.0,
        getattr(ns, "trace_speed_end", None),
    )  # fmt: skip


def _trace_stage(ns: argparse.Namespace) -> list[Stage]:
    clash = [flag for flag, v in (("--stage", ns.stage), ("--sweep", ns.sweep),
             ("--rate", ns.rate), ("--concurrency", ns.concurrency), ("--ramp", ns.ramp),
             ("--dataset", ns.dataset), ("--shared-prefix", ns.shared_prefix),
             ("--warmup", ns.warmup), ("--chat", ns.chat)) if v]  # fmt: skip
    if clash:
        raise CliError(f"--trace is the load and the workload: drop {', '.join(clash)}")
    replay = _trace_replay(ns)
    assert replay is not None
    return _trace_stages(replay)


def _trace_stages(replay: TraceReplay) -> list[Stage]:
    """The one stage a replay is: the trace's send times, as many requests."""
    try:
        plan = replay.plan()[1]
    except TraceError as e:
        raise CliError(str(e)) from None
    return [Stage("trace", Replay(plan.offsets_s), None, len(plan.offsets_s))]


def build_stages(ns: argparse.Namespace) -> list[Stage]:
    try:
        _probe_spec(ns)  # bad probe flags fail before the run directory is made
    except DatasetError as e:
        raise CliError(str(e)) from None
    if getattr(ns, "trace", None) is not None:
        if getattr(ns, "sessions", False):
            raise CliError("--trace is the load and the workload: drop --sessions")
        return _trace_stage(ns)
    _session_shape(ns)  # bad session flags fail before the run directory is made
    if getattr(ns, "priorities", None):
        try:
            parse_priorities(ns.priorities)
        except DatasetError as e:
            raise CliError(str(e)) from None
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


async def _workload(
    ns: argparse.Namespace, client: httpx.AsyncClient, model: str, time_scale: float | None
) -> WorkloadSpec:
    classes = parse_priorities(ns.priorities) if getattr(ns, "priorities", None) else None
    probes = _probe_spec(ns)
    if getattr(ns, "trace", None) is not None:
        tok = await tokenize_corpus(client, ns.url, model, ns.seed)
        limit = await max_model_len(client, ns.url, model)
        spec = WorkloadSpec(seed=ns.seed, trace=_trace_replay(ns, limit, time_scale),
                            tokens=tuple(tok[0]) if tok else None,
                            priorities=classes, probes=probes)  # fmt: skip
        next(spec.items())  # no /tokenize: refused here, before the run
        return spec
    spec = WorkloadSpec(
        input_len=ns.input_len,
        output_len=ns.output_len,
        seed=ns.seed,
        dataset=ns.dataset,
        shared_prefix=ns.shared_prefix,
        prefix_groups=ns.prefix_groups,
        sessions=_session_shape(ns),
        priorities=classes,
        probes=probes,
    )
    if ns.dataset is None:
        tok = await tokenize_corpus(client, ns.url, model, ns.seed)
        if tok is not None:
            spec = replace(spec, tokens=tuple(tok[0]))
    next(spec.items())  # bad lengths or a bad dataset fail here, before the run
    spec.conversations()  # and sessions on a server without /tokenize
    return spec


def _probe_spec(ns: argparse.Namespace) -> ProbeSpec | None:
    """The probe stream `--probe-rate` asks for (None without it; `search` has none)."""
    rate = getattr(ns, "probe_rate", None)
    if rate is None:
        return None
    return ProbeSpec(rate, ns.probe_input_len, ns.probe_output_len)


def _session_shape(ns: argparse.Namespace) -> SessionShape | None:
    """The sessions `--sessions` asks for (None without it), every flag checked."""
    if not getattr(ns, "sessions", False):
        defaults = (
            ("--turns", "turns", "4"),
            ("--think-time", "think_time", "0"),
            ("--turn-input-len", "turn_input_len", "64"),
            ("--fanout", "fanout", 1),
        )
        given = [flag for flag, name, default in defaults
                 if getattr(ns, name, default) != default]  # fmt: skip
        if given:
            raise CliError(f"{', '.join(given)}: only with --sessions")
        return None
    clash = [flag for flag, v in (("--dataset", ns.dataset), ("--chat", ns.chat),
             ("--prefix-groups", ns.prefix_groups != 1)) if v]  # fmt: skip
    if clash:
        raise CliError(f"--sessions sends token-exact conversations: drop {', '.join(clash)}")
    shape = SessionShape(
        turns=ns.turns, think_time=ns.think_time, first_input_len=ns.input_len,
        turn_input_len=ns.turn_input_len, output_len=ns.output_len or "128",
        fanout=ns.fanout, system_prompt=ns.shared_prefix,
    )  # fmt: skip
    try:
        shape.check()
    except DatasetError as e:
        raise CliError(str(e)) from None
    return shape


async def prepare_run(
    ns: argparse.Namespace, headers: dict[str, str]
) -> tuple[str, WorkloadSpec, float | None]:
    """The served model, the workload, checked before any load is sent, and the target's time
    scale if it is a kvwatch twin (None: a real server, whose time is wall time)."""
    async with httpx.AsyncClient(timeout=10, headers=headers) as client:
        try:
            if ns.model:  # named: the server need only answer (it may not list models)
                await client.get(ns.url.rstrip("/") + "/v1/models")
                model = ns.model
            else:
                model = await served_model(client, ns.url)
        except (httpx.HTTPError, ValueError, KeyError) as e:
            raise CliError(one_line(f"cannot reach {ns.url}: {e}"), EXIT_UNREACHABLE) from None
        metrics_url = server_metrics_url(ns)
        time_scale = None if metrics_url is None else await _time_scale(client, metrics_url)
        try:
            workload = await _workload(ns, client, model, time_scale)
        except (DatasetError, TraceError) as e:
            raise CliError(str(e)) from None
        return model, workload, time_scale


async def _time_scale(client: httpx.AsyncClient, url: str) -> float | None:
    from kvwatch.sidecar.metrics.twin import read_time_scale

    try:
        r = await client.get(url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    return read_time_scale(r.text) if r.status_code == 200 else None


def server_metrics_url(ns: argparse.Namespace) -> str | None:
    """Where the run reads the server's /metrics: --server-metrics, or --url; None for none."""
    chosen = getattr(ns, "server_metrics", None)
    if chosen is None:
        return str(ns.url)
    return None if chosen == "none" else str(chosen)


def announce_time_scale(time_scale: float | None) -> None:
    if time_scale is not None and time_scale != 1.0:
        print(
            f"the target is a kvwatch twin at time scale {time_scale:g}: every latency it shows "
            f"is {time_scale:g}x the simulated card's; the stall rule and SLOs are judged in "
            "wall time (x the scale), and the records and summary are wall seconds",
            file=sys.stderr,
        )


def in_wall_time(
    stall: StallRule, slo: dict[str, float], time_scale: float | None
) -> tuple[StallRule, dict[str, float]]:
    """A twin at time scale K stretches every duration K times: the stall floor and the SLO
    limits, given in the card's seconds, become wall seconds, so judging the wall-clock records
    against them is judging the card (without this, K = 4 reported false stalls)."""
    k = time_scale or 1.0
    if k == 1.0:
        return stall, slo
    return StallRule(stall.factor, stall.min_s * k), {m: v * k for m, v in slo.items()}


def send_stages(
    ns: argparse.Namespace,
    stages: list[Stage],
    opts: RunOptions,
    workload: WorkloadSpec,
    stall: StallRule,
    progress: Progress,
) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs the stages in this process or in worker processes; (start, records, events)."""
    if ns.workers > 1:
        from kvwatch.loadgen.send.workers import run_in_workers

        print(f"starting {ns.workers} sender processes ...", file=sys.stderr)
        start_unix, records, events = run_in_workers(ns.workers, stages, opts, workload, stall)
    else:

        async def go() -> Any:
            ticker = None
            if not ns.no_progress:
                ticker = asyncio.create_task(print_progress(progress, time.perf_counter()))
            try:
                return await run_stages(
                    stages, opts, workload.items(), progress,
                    conversations=workload.conversations(), probes=workload.probe_stream(),
                )  # fmt: skip
            finally:
                if ticker:
                    ticker.cancel()

        result = run_loop(go())
        if not ns.no_progress:
            print(file=sys.stderr)
        start_unix, events = result.start_unix, result.events
        records = [r.to_dict(result.t0, stall) for r in result.records]
    return start_unix, records, events


def run_load(ns: argparse.Namespace) -> int:
    from kvwatch.loadgen.results.rundir import discard_if_empty, prepare_run_dir
    from kvwatch.loadgen.results.summary import SloError, parse_slo

    stages = build_stages(ns)
    if not ns.request_timeout > 0:
        raise CliError(f"--request-timeout must be above 0 seconds, not {ns.request_timeout:g}")
    try:
        slo = parse_slo(ns.slo)
    except SloError as e:
        raise CliError(str(e)) from None
    run_dir = ns.run_dir or Path("runs") / time.strftime("loadgen-%Y%m%d-%H%M%S")
    try:
        created = prepare_run_dir(run_dir)
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        return _run_into(ns, run_dir, stages, slo)
    except BaseException:
        if created:
            discard_if_empty(run_dir)
        raise


def _run_into(
    ns: argparse.Namespace, run_dir: Path, stages: list[Stage], slo: dict[str, float]
) -> int:
    """The load, then its records written into `run_dir` (made and probed already)."""
    from kvwatch.loadgen.results.rundir import write_run
    from kvwatch.loadgen.results.summary import (
        render_classes,
        render_probes,
        render_server_timings,
        render_table,
        render_turns,
        summarize_records,
        timing_caveat,
    )

    api_key = os.environ.get(ns.api_key_env) or None
    progress = Progress()

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def sidecar_end() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await sidecar_incidents(client, ns.sidecar)

    model, workload, time_scale = run_loop(prepare_run(ns, headers))
    announce_time_scale(time_scale)
    if workload.trace is not None:  # its lengths fit to the server, its times to a twin's scale
        stages = _trace_stages(workload.trace)
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
        kv_report=ns.kv_report,
    )
    stall, slo = in_wall_time(StallRule(ns.stall_factor, ns.stall_min), slo, time_scale)
    send = lambda: send_stages(ns, stages, opts, workload, stall, progress)  # noqa: E731
    with contextlib.ExitStack() as stack:
        recorder = None
        if ns.kv_events:
            from kvwatch.loadgen.results.kv_events import KvEventRecorder

            recorder = KvEventRecorder(ns.kv_events, ns.kv_events_replay, run_dir)
            stack.enter_context(recorder)
        m = measure(server_metrics_url(ns), headers, ns.sidecar, send)
    summary = summarize_records(m.records, slo)
    if recorder is not None:
        summary["kv_events"] = recorder.summary()
    if time_scale is not None:
        summary["time_scale"] = time_scale
    if (delta := m.server_delta()) is not None:
        summary["server"] = delta
    if ns.sidecar:
        summary["sidecar"] = run_loop(sidecar_end())
    if workload.sessions is not None and "sessions" in summary:
        cache = (m.server_before or {}).get("cache") or {}
        ws = session_working_set(m.records, cache.get("block_size") or 16,
                                 workload.sessions.system_prompt)  # fmt: skip
        if ws is not None:
            summary["sessions"]["working_set"] = working_set_advice(ws, cache)
    if workload.trace is not None:
        summary["trace"] = replay_report(workload.trace, summary.get("server"),
                                         (m.server_before or {}).get("cache"))  # fmt: skip
    spec = run_spec(
        ns.url, model, ns.chat, ns.seed, slo, ns.workers, stages, workload,
        not ns.no_ignore_eos, stall, m, time_scale,
    )  # fmt: skip
    write_run(run_dir, spec, m.records, m.events, summary, m.timeline)
    if ns.json:
        import json

        print(json.dumps(summary, indent=2))
    else:
        print(render_table(summary))
        for extra in (render_classes(summary), render_probes(summary),
                      render_server_timings(summary)):  # fmt: skip
            if extra is not None:
                print(extra)
        if (turns := render_turns(summary)) is not None:
            print(turns)
            if "working_set" in summary["sessions"]:
                print(render_working_set(summary["sessions"]["working_set"]))
        print(f"run directory: {run_dir}")
    if "trace" in summary:
        print(render_replay(summary["trace"]), file=sys.stderr)
    caveat = timing_caveat(summary)
    if caveat:
        print(f"kvwatch: warning: {caveat}", file=sys.stderr)
    return EXIT_FOUND if summary["overall"].get("failed") else 0
