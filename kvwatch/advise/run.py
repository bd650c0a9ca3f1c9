"""`kvwatch advise`: sizing advice from a run directory, a live sidecar, a vLLM /metrics URL,
or figures alone (what-if). Exit 0 when the load fits, 1 when the cache is undersized."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from kvwatch.advise.fleet_latency import fleet_step_lines
from kvwatch.advise.prometheus import prometheus_as_cli
from kvwatch.advise.sources import observed_from_source
from kvwatch.common.cli_kit import EXIT_FOUND, CliError, one_line
from kvwatch.sizing.advice import Advice, Observed, advise
from kvwatch.sizing.budget import default_max_num_seqs
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.fleet import FleetAdvice, advise_fleet
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.sizing.levers import ServerInfo
from kvwatch.sizing.presets import GpuSpec
from kvwatch.timing.calibration import Calibration, read_calibration
from kvwatch.timing.prefill_levers import PrefillAdvice, prefill_advice, prefill_advice_by_model
from kvwatch.timing.steptime import StepConstants, StepError, StepModel

if TYPE_CHECKING:
    from kvwatch.loadgen.results.run_files import RunFiles

__all__ = ["run_advise"]


def _render(name: str, obs: Observed, adv: Advice) -> str:
    lines = [f"{name}: {adv.verdict}", f"  advised for {adv.advised_for}"]
    if obs.preemptions:
        lines.append(f"  preemptions observed: {obs.preemptions:,.0f}")
    lines += ["  arithmetic:"] + [f"    {x}" for x in adv.arithmetic]
    if adv.recommended:
        lines.append(f"  recommended: {adv.recommended}")
    if adv.options:
        lines += ["  change one of:"] + [f"    {x}" for x in adv.options]
    lines += ["  assumptions:"] + [f"    {x}" for x in adv.assumptions]
    return "\n".join(lines)


def _run_what_if(ns: argparse.Namespace) -> int:
    from kvwatch.advise.whatif import render_what_if, what_if

    a = what_if(ns)
    server = ServerInfo(version=ns.vllm_version)
    adv = None if a.observed is None else advise(a.observed, ns.margin, a.gpu, server)
    if ns.json:
        item: dict[str, Any] = {"name": a.name, "what_if": a.to_dict()}
        if a.observed is not None and adv is not None:
            item |= {"observed": _observed_dict(a.observed), "advice": adv.to_dict()}
        print(json.dumps([item], indent=2, default=str))
    else:
        lines = [f"{a.name}:", *render_what_if(a)]
        if a.observed is not None and adv is not None:
            lines += [
                "",
                _render(f"{a.name}, {a.observed.peak_demand:g} requests", a.observed, adv),
            ]
        print("\n".join(lines))
    return EXIT_FOUND if adv is not None and adv.options else 0


def _observed_dict(o: Observed) -> dict[str, Any]:
    d = {k: v for k, v in o.__dict__.items() if k != "layout"}
    d["layout"] = None if o.layout is None else [g.kind for g in o.layout.groups]
    return d


def run_advise(ns: argparse.Namespace) -> int:
    try:
        if ns.what_if:
            return _run_what_if(ns)
        gpu = lookup_gpu(ns.gpu) if ns.gpu else None
        run = None
        if ns.run:  # read once: the KV advice and the prompt budget's both stand on it
            from kvwatch.loadgen.results.run_observed import run_for_advice

            run = run_for_advice(ns.run)
        with prometheus_as_cli():
            items, server = observed_from_source(ns, run)
            fleets = _fleets(ns)
        results = [(name, obs, advise(obs, ns.margin, gpu, server)) for name, obs in items]
    except SizingError as e:
        raise CliError(str(e)) from None
    prefill = _prefill(ns, gpu, run) if run is not None else None
    if ns.json:
        out = [
            {"name": n, "observed": _observed_dict(o), "advice": a.to_dict()} for n, o, a in results
        ]
        if out and prefill is not None:
            out[0]["prefill"] = prefill.to_dict()
        out += [{"name": f"fleet {f.model}", "fleet": f.to_dict()} for f in fleets]
        print(json.dumps(out, indent=2, default=str))
    else:
        blocks = [_render(n, o, a) for n, o, a in results]
        if blocks and prefill is not None:
            blocks[0] += "\n" + "\n".join(prefill.lines())
        print("\n\n".join(blocks + _render_fleets(fleets)))
    found = any(a.options for _, _, a in results) or any(f.options for f in fleets)
    return EXIT_FOUND if found else 0


def _prefill(ns: argparse.Namespace, gpu: GpuSpec | None, run: RunFiles) -> PrefillAdvice | None:
    """The prompt-budget lever, where the run's stalls were mostly prefill interference
    (kvwatch/timing/prefill_levers.py): the server's budget from --max-num-batched-tokens,
    else vLLM's default for --gpu; none known, no figure."""
    o = run.summary.overall
    ok = [r for r in run.records if r.ok and r.prompt_tokens]
    own = sum(r.prompt_tokens or 0 for r in ok) / len(ok) if ok else None
    prompt = own
    srv = run.summary.server
    if srv.prompt_tokens and srv.finished_requests:  # every client's prompts, as served
        prompt = max(own or 0.0, srv.prompt_tokens / srv.finished_requests)
    budget = ns.max_num_batched_tokens or (gpu.batched_tokens if gpu else None)
    seqs = ns.max_num_seqs or (default_max_num_seqs(gpu) if gpu else None)
    causes = {c: (n, sec) for c, n, sec in o.stall_causes}
    busy = [row.running for row in run.timeline if row.running]
    if ns.model and gpu is not None and budget and prompt and own and busy:
        cal = _calibration(ns)
        try:
            steps = StepModel(
                resolve_model(ns.model, ns.layers), gpu, ns.tp,
                constants=cal.step_constants() if cal else StepConstants(),
            )  # fmt: skip
        except (SizingError, StepError) as e:
            raise CliError(one_line(str(e))) from None
        output = sum(r.output_tokens or 0 for r in ok) / len(ok)
        return prefill_advice_by_model(
            causes, steps, round(sum(busy) / len(busy)), round(own + output / 2), budget,
            prompt, seqs,
        )  # fmt: skip
    return prefill_advice(causes, o.itl.p50 if o.itl else None, budget, prompt, seqs)


def _fleets(ns: argparse.Namespace) -> list[FleetAdvice]:
    """With --prometheus: advice per model served by two or more engines (the fleet rules'
    recordings; none without them)."""
    if not getattr(ns, "prometheus", None):
        return []
    from kvwatch.advise.fleet_source import fleets_from_prometheus
    from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS

    pressure = DEFAULT_THRESHOLDS.pressure_kv
    cal = _calibration(ns)
    fleets = fleets_from_prometheus(ns.prometheus, ns.window, ns.step)
    out = []
    for f in fleets:
        advice = advise_fleet(f, pressure)
        if cal is not None:
            try:
                advice.arithmetic += fleet_step_lines(cal, ns.calibration, f, advice)
            except (SizingError, StepError) as e:
                advice.arithmetic.append(f"no step time from the calibration: {one_line(str(e))}")
        out.append(advice)
    return out


def _calibration(ns: argparse.Namespace) -> Calibration | None:
    """`--calibration FILE` for the fleet's advice, checked where it enters."""
    path = getattr(ns, "calibration", None)
    if path is None:
        return None
    try:
        return read_calibration(path)
    except SizingError as e:
        raise CliError(one_line(str(e))) from None


def _render_fleets(fleets: list[FleetAdvice]) -> list[str]:
    out = []
    for f in fleets:
        lines = [f"fleet {f.model} ({f.replicas_now} engines): {f.verdict}", "  arithmetic:"]
        lines += [f"    {x}" for x in f.arithmetic]
        if f.options:
            lines += ["  change:"] + [f"    {x}" for x in f.options]
        if f.evidence:
            lines += ["  per engine:"] + [f"    {x}" for x in f.evidence]
        out.append("\n".join(lines))
    return out
