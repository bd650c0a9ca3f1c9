"""`kvwatch loadgen search`: probe rising loads for the SLO limit and the KV onset.

The strategy is loadgen/search.py (pure); this runs each probe it asks for as a one-stage
`loadgen run` (loadgen/measure.py), writes every probe's run directory, and prints the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_UNREACHABLE, CliError, one_line
from kvwatch.loadgen.cmd_run import (
    announce_time_scale,
    in_wall_time,
    prepare_run,
    send_stages,
    server_metrics_url,
)
from kvwatch.loadgen.forecast import forecast_doc, forecast_line, mean_lengths, render_forecast
from kvwatch.loadgen.measure import Measured, measure, run_spec, snapshot_once
from kvwatch.loadgen.results.records import StallRule
from kvwatch.loadgen.results.rundir import discard_if_empty, prepare_run_dir, write_run
from kvwatch.loadgen.results.search_file import SEARCH_FILE, render_search, search_from_doc
from kvwatch.loadgen.results.server_metrics import sidecar_preemptions
from kvwatch.loadgen.results.summary import SloError, parse_slo, summarize_records
from kvwatch.loadgen.search import CapacitySearch, LoadVerdict, ProbeResult, SearchPlan
from kvwatch.loadgen.send.runner import Progress, RunOptions, run_loop
from kvwatch.loadgen.workload.arrivals import Concurrency, Poisson
from kvwatch.loadgen.workload.schedule import Stage
from kvwatch.loadgen.workload.spec import WorkloadSpec
from kvwatch.sizing.errors import SizingError
from kvwatch.timing.calibration import Calibration, read_calibration

__all__ = ["run_search", "probe_stage", "search_doc", "kv_ran_out"]

_STALL = StallRule(5.0, 0.25)
_SETTLE_S = 1.0  # between probes: the last one's requests are gone from the server's gauges


def probe_stage(
    by: str, load: float, name: str, requests: int | None, duration_s: float | None
) -> Stage:
    """One probe: a closed loop of `load` streams, or Poisson arrivals at `load` per second."""
    if by == "concurrency":
        n = int(load)
        if requests is None and duration_s is None:
            requests = max(16, 4 * n)
        return Stage(name, Concurrency(n), duration_s, requests)
    if requests is None and duration_s is None:
        duration_s = 30.0
    return Stage(name, Poisson(load), duration_s, requests)


def _plan(ns: argparse.Namespace, start: float | None = None) -> SearchPlan:
    try:
        return SearchPlan(
            ns.by, ns.attainment, start or ns.start or 1.0, ns.max_load,
            precision=ns.precision, repeats=ns.repeats,
            max_repeats=max(ns.repeats, ns.max_repeats),
        )  # fmt: skip
    except ValueError as e:
        raise CliError(str(e)) from None


def _preemptions(m: Measured, sidecar_before: float | None, sidecar_after: float | None
                 ) -> float | None:  # fmt: skip
    """The server's own count; the sidecar's when the server's /metrics gave none."""
    delta = m.server_delta()
    if delta is not None and delta.get("preemptions") is not None:
        return float(delta["preemptions"])
    if sidecar_before is not None and sidecar_after is not None:
        return max(0.0, sidecar_after - sidecar_before)
    return None


def kv_ran_out(m: Measured) -> bool | None:
    """Did the cache run out during this load: it preempted, or a sample of the server's
    timeline had requests waiting while the free blocks could not hold the median prompt (vLLM
    admits a request only when its prompt fits). None when the server's figures cannot tell."""
    delta = m.server_delta()
    if delta is not None and (delta.get("preemptions") or 0) > 0:
        return True
    cache = (m.server_before or {}).get("cache") or {}
    blocks, size = cache.get("num_blocks"), cache.get("block_size")
    prompts = sorted(int(r["prompt_tokens"]) for r in m.records if r.get("prompt_tokens"))
    if not (blocks and size and prompts and m.timeline):
        return None
    need = prompts[len(prompts) // 2]
    return any(
        (r.get("waiting") or 0) >= 1 and (1 - r["kv_usage"]) * blocks * size < need
        for r in m.timeline
        if r.get("kv_usage") is not None
    )


def run_search(ns: argparse.Namespace) -> int:
    plan = _plan(ns)
    cal = _calibration(ns)  # a broken file is refused before the server is asked anything
    try:
        slo = parse_slo(ns.slo)
    except SloError as e:
        raise CliError(str(e)) from None
    if not slo:
        raise CliError("--slo names no limit: the search looks for the highest load meeting it")
    given = (("--probe-requests", ns.probe_requests), ("--probe-duration", ns.probe_duration))
    for flag, v in given:
        if v is not None and v <= 0:
            raise CliError(f"{flag} must be positive")
    api_key = os.environ.get(ns.api_key_env) or None
    run_dir: Path = ns.run_dir or Path("runs") / time.strftime("search-%Y%m%d-%H%M%S")
    try:
        created = prepare_run_dir(run_dir)
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        return _search_into(ns, run_dir, plan, slo, api_key, cal)
    except BaseException:
        if created:
            discard_if_empty(run_dir)
        raise


def _search_into(
    ns: argparse.Namespace,
    run_dir: Path,
    plan: SearchPlan,
    slo: dict[str, float],
    api_key: str | None,
    cal: Calibration | None = None,
) -> int:
    """The search's probes, each written under `run_dir` (made and probed already)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model, workload, time_scale = run_loop(prepare_run(ns, headers))
    announce_time_scale(time_scale)
    stall, slo = in_wall_time(_STALL, slo, time_scale)
    forecast = None
    if cal is not None:
        forecast = _forecast(ns, cal, headers, model, workload, slo, time_scale)
        if ns.start is None and forecast.get("slo_limit"):
            plan = _plan(ns, max(1.0, float(forecast["slo_limit"] // 2)))

    async def sidecar_count() -> float | None:
        if not ns.sidecar:
            return None
        async with httpx.AsyncClient(timeout=10) as client:
            return await sidecar_preemptions(client, ns.sidecar, ns.url)

    search = CapacitySearch(plan)
    meta: list[dict[str, Any]] = []
    unit = _unit(plan.by)
    started = time.time()
    while (load := search.next_load()) is not None:
        k = len(search.probes) + 1
        repeat = sum(1 for p in search.probes if p.load == load) + 1
        name = f"{k:02d}-{plan.by}-{load:g}-r{repeat}"
        stage = probe_stage(plan.by, load, name, ns.probe_requests, ns.probe_duration)
        print(f"probe {k}: {load:g} {unit} (#{repeat} at this load) ...", file=sys.stderr)
        seed = ns.seed + k  # new prompts each probe: a repeat must not ride the prefix cache
        wl: WorkloadSpec = replace(workload, seed=seed)
        opts = RunOptions(
            ns.url, model, chat=ns.chat, ignore_eos=not ns.no_ignore_eos, seed=seed,
            api_key=api_key, max_inflight=ns.max_inflight,
            request_timeout_s=ns.request_timeout, events_url=ns.sidecar,
        )  # fmt: skip
        side_before = run_loop(sidecar_count())
        progress = Progress()
        m = measure(
            server_metrics_url(ns), headers, ns.sidecar,
            lambda: send_stages(ns, [stage], opts, wl, stall, progress),  # noqa: B023
        )  # fmt: skip
        side_after = run_loop(sidecar_count())
        summary = summarize_records(m.records, slo)
        if time_scale is not None:
            summary["time_scale"] = time_scale
        if (delta := m.server_delta()) is not None:
            summary["server"] = delta
        spec = run_spec(
            ns.url, model, ns.chat, seed, slo, ns.workers, [stage], wl,
            not ns.no_ignore_eos, stall, m, time_scale,
        )  # fmt: skip
        write_run(run_dir / "probes" / name, spec, m.records, m.events, summary, m.timeline)
        o = summary["overall"]
        requests = int(o.get("requests") or 0)
        attained = round((o.get("slo_attainment") or 0.0) * requests)
        probe = ProbeResult(
            load, requests, attained, _preemptions(m, side_before, side_after),
            float(o.get("duration_s") or 0.0), name, kv_ran_out(m),
        )  # fmt: skip
        search.record(probe)
        meta.append({**asdict(probe), "repeat": repeat, "failed": int(o.get("failed") or 0)})
        print(f"  {_probe_line(probe)}", file=sys.stderr)
        # after every probe: an interrupted search keeps what it measured
        doc = search_doc(search, slo, ns.url, model, workload, meta, started, forecast)
        (run_dir / SEARCH_FILE).write_text(json.dumps(doc, indent=1))
        if (why := _unanswered(m.records)) is not None:
            raise CliError(
                f"probe {k}: every request failed ({why}); a server that answers none has no "
                f"capacity to find (the probes so far are in {run_dir})",
                EXIT_UNREACHABLE,
            )
        time.sleep(_SETTLE_S)
    result = search.result()
    doc = search_doc(search, slo, ns.url, model, workload, meta, started, forecast)
    advice = _advice(run_dir, doc)
    if advice is not None:
        doc["advice"] = advice
    (run_dir / SEARCH_FILE).write_text(json.dumps(doc, indent=1))
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render_search(search_from_doc(doc)))
        if forecast is not None:
            print(forecast_line(forecast, doc["result"]))
        print(f"run directory: {run_dir}  (kvwatch report {run_dir} draws the capacity page)")
    return 0 if result.max_ok is not None else EXIT_FOUND


def _unanswered(records: list[dict[str, Any]]) -> str | None:
    """The first error when a probe sent requests and none succeeded (the server went away or
    refuses every request: its SLO misses would otherwise read as a capacity); else None."""
    if not records or any(r.get("ok") for r in records):
        return None
    return " ".join(str(records[0].get("error") or "no answer").split())[:200]


def _unit(by: str) -> str:
    return "in flight" if by == "concurrency" else "req/s"


def _probe_line(p: ProbeResult) -> str:
    share = p.attained / p.requests if p.requests else 0.0
    pre = "preemptions unknown" if p.preemptions is None else f"{p.preemptions:.0f} preemptions"
    per_s = p.preemptions / p.duration_s if p.preemptions and p.duration_s > 0 else None
    rate = "" if per_s is None else f" ({per_s:.2f}/s)"
    return f"{p.requests} requests, {share:.0%} met the SLOs, {pre}{rate}, {p.duration_s:.0f} s"


def _verdict_doc(v: LoadVerdict | None, target: float) -> dict[str, Any] | None:
    if v is None:
        return None
    lo, hi = v.interval
    return {
        "load": v.load,
        "probes": [p.name for p in v.probes],
        "requests": v.requests,
        "attained": v.attained,
        "attainment": v.attainment,
        "interval95": [lo, hi],
        "decided": v.decided(target),
        "preemptions": v.preemptions,
        "preemptions_per_s": v.preemptions_per_s,
        "ran_out": v.ran_out,
    }


def search_doc(
    search: CapacitySearch,
    slo: dict[str, float],
    target_url: str,
    model: str,
    workload: WorkloadSpec,
    probes: list[dict[str, Any]],
    started_unix: float,
    forecast: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """search.json: the plan, every probe, every load pooled, the result, and the calibrated
    forecast where one was asked for."""
    r = search.result()
    t = r.target
    return {
        **({"forecast": forecast} if forecast is not None else {}),
        "kind": "capacity_search",
        "target": target_url,
        "model": model,
        "started_unix": started_unix,
        "slo": slo,
        "plan": asdict(search.plan),
        "workload": workload.describe(),
        "probes": probes,
        "loads": [_verdict_doc(v, t) for v in r.verdicts],
        "result": {
            "by": r.by,
            "attainment_target": t,
            "max_ok": _verdict_doc(r.max_ok, t),
            "min_fail": _verdict_doc(r.min_fail, t),
            "kv_onset": _verdict_doc(r.onset, t),
            "kv_clean": _verdict_doc(r.clean, t),
            "kv_ran_out": _verdict_doc(r.ran_out, t),
            "binding": r.binding,
        },
    }


def _calibration(ns: argparse.Namespace) -> Calibration | None:
    """`--calibration FILE`, read and checked where it enters."""
    path = getattr(ns, "calibration", None)
    if path is None:
        return None
    if ns.by != "concurrency":
        raise CliError("--calibration forecasts closed loops: use it with --by concurrency")
    try:
        return read_calibration(path)
    except SizingError as e:  # its message names the file
        raise CliError(one_line(f"--calibration: {e}")) from None


def _forecast(
    ns: argparse.Namespace,
    cal: Calibration,
    headers: dict[str, str],
    served: str,
    workload: WorkloadSpec,
    slo: dict[str, float],
    time_scale: float | None,
) -> dict[str, Any]:
    """The search's forecast from the server's own cache and the calibrated step model,
    printed before the first probe (search.json's `forecast`)."""
    cache = (snapshot_once(server_metrics_url(ns), headers) or {}).get("cache") or {}
    if not (cache.get("num_blocks") and cache.get("block_size")):
        raise CliError(
            "--calibration needs the server's cache size: its /metrics gave no "
            "cache_config_info (num_gpu_blocks, block_size)"
        )
    try:
        lengths = mean_lengths(workload)
        doc = forecast_doc(
            cal, ns.calibration, cache, lengths, slo, int(ns.max_load), time_scale, served
        )
    except ValueError as e:  # the sizing's, the step model's, the workload's refusals
        raise CliError(one_line(f"--calibration: {e}")) from None
    print(render_forecast(doc), file=sys.stderr)
    return doc


def _advice(run_dir: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The sizing advice where the binding limit is met: the KV onset's first probe (the
    cache ran out there), else the lowest failing load's."""
    from kvwatch.loadgen.results.run_observed import observed_from_dir
    from kvwatch.sizing.advice import advise

    res = doc["result"]
    at = res["kv_onset"] or res["min_fail"]
    if at is None:
        return None
    probe_dir = run_dir / "probes" / at["probes"][0]
    try:
        observed, server = observed_from_dir(probe_dir)
        adv = advise(observed, server=server)
    except SizingError as e:
        return {"probe": at["probes"][0], "verdict": f"no advice: {e}", "recommended": None,
                "options": []}  # fmt: skip
    return {
        "probe": at["probes"][0],
        "verdict": adv.verdict,
        "advised_for": adv.advised_for,
        "recommended": adv.recommended,
        "options": list(adv.options),
    }
