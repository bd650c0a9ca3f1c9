"""`kvwatch calibrate`: fit the step model to what a user's own server measured.

From load runs (`--run DIR`, repeatable; `kvwatch loadgen run`'s directories): each stage is one
load; its streams in flight (Little's law over the stage: the requests' time in the server
over the stage's span), its mean prompt and output lengths, and its mean TPOT and TTFT become
figures for `timing/calibration.py`. A twin's run is read in the twin's simulated seconds (the
run's time scale), and the file says so. From the server itself (`--metrics`, `--sidecar`,
`--prometheus`): its counters cut into slices, and those of a busy server pooled into spans
whose mean step is predicted from their own mix (`advise/server_readings.py`,
`timing/server_slices.py`). The calibration file goes to `--out`; `advise --what-if
--calibration FILE` and `kvwatch twin --calibration FILE` predict with it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kvwatch.common.cli_kit import CliError
from kvwatch.sizing.budget import default_max_num_seqs
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.calibration import (
    SERVER_ROBUST,
    Calibration,
    CalibrationError,
    Figure,
    calibrate,
)
from kvwatch.timing.measured import Load

if TYPE_CHECKING:
    from kvwatch.loadgen.results.run_files import Record

__all__ = ["run_calibrate", "figures_from_run", "render"]

_MIN_REQUESTS = 4  # a stage with fewer completed requests gives no figure
_PROMETHEUS_POINTS = 11_000  # the most points Prometheus returns for one range query
_CLOSED = re.compile(r"Concurrency\(n=(\d+)\)")  # a closed-loop stage in spec.json


def figures_from_run(
    run_dir: Path, batched_tokens: int, max_num_seqs: int
) -> tuple[list[Figure], float, list[str]]:
    """The run's stages as figures, the time scale they were divided by, and what was skipped."""
    from kvwatch.loadgen.results.run_files import read_run

    try:
        run = read_run(run_dir)
    except ValueError as e:
        raise CliError(str(e)) from None
    scale = run.summary.time_scale
    by_stage: dict[str, list[Record]] = {}
    for r in run.records:
        if r.ok and not r.warmup and not r.probe:
            by_stage.setdefault(r.stage, []).append(r)
    streams = {
        st.name: int(m.group(1))
        for st in run.spec.stages
        if (m := _CLOSED.fullmatch(st.pattern or ""))
    }
    figures: list[Figure] = []
    skipped: list[str] = []
    for stage, recs in by_stage.items():
        fig, why = _stage_figures(
            stage, recs, streams.get(stage), scale, batched_tokens, max_num_seqs
        )
        figures += fig
        if why:
            skipped.append(f"stage {stage}: {why}")
    preempted = run.summary.server.preemptions
    if preempted is not None and preempted > 0:
        skipped.append(
            f"the server preempted {preempted:.0f} times during the run: recompute is in its "
            "figures, which read slower than the steps alone"
        )
    return figures, scale, skipped


def _timings(r: Record) -> list[float] | None:
    """A record's send, finish, lengths, TPOT and TTFT, where each is a non-negative number (a
    hand-edited run may hold anything)."""
    vals = [r.sent_at, r.finished_at, r.prompt_tokens, r.output_tokens, r.tpot, r.ttft]
    if any(v is None or not v >= 0 for v in vals):
        return None
    return [float(v or 0.0) for v in vals]


def _stage_figures(
    stage: str,
    recs: list[Record],
    streams: int | None,
    scale: float,
    batched: int,
    max_seqs: int,
) -> tuple[list[Figure], str | None]:
    """A stage's steady state: a closed loop of N streams starts with N prompts at once and
    drains at its end, neither of which is the steady load; its requests after the first N
    sent and before the last N - 1 are. Other patterns: every request, and the streams in
    flight by Little's law over the stage."""
    rows = sorted((t for r in recs if (t := _timings(r)) is not None), key=lambda r: r[0])
    if streams is not None and len(rows) - (2 * streams - 1) >= _MIN_REQUESTS:
        rows = rows[streams : len(rows) - (streams - 1)]
    elif streams is not None:
        return [], (
            f"{len(rows)} completed requests at {streams} streams: a steady state needs "
            f"{2 * streams - 1 + _MIN_REQUESTS} (the first {streams} start together, the last "
            f"{streams - 1} drain)"
        )
    if len(rows) < _MIN_REQUESTS:
        return [], f"{len(rows)} completed requests with timings (needs {_MIN_REQUESTS})"
    sent, done, prompt, out, tpots, ttfts = (list(col) for col in zip(*rows, strict=True))
    cycle = statistics.fmean(d - s for s, d in zip(sent, done, strict=True)) / scale
    span = max(done) - min(sent)
    if span <= 0:
        return [], "no time between its first send and last answer"
    conc = streams or max(1, round(sum(d - s for s, d in zip(sent, done, strict=True)) / span))
    p = max(1, round(statistics.fmean(prompt)))
    o = max(2, round(statistics.fmean(out)))
    wave = _wave(sent, statistics.median(ttfts), streams) if streams else 0
    load = Load("fixed_concurrency", conc, p, o, batched, max_seqs, wave)
    tpot = statistics.median(tpots) / scale  # a stall or two must not move a stage
    ttft = statistics.median(ttfts) / scale
    label = f"{stage}: {conc} stream{'s' if conc > 1 else ''} of {p:,} + {o:,} tokens"
    label += f" in waves of {wave}" if wave else ""
    figures = [Figure(label, load, "tpot_s", tpot)]
    # a TTFT past one stream rests on how the prompts reach the engine across its steps,
    # which the wave model does not carry: on the twin, with the hidden constants themselves,
    # it read 24-85% slow at 8-64 streams, and fitted it pulled `mfu` 30% and `kv_efficiency`
    # 48% off (bench_calibrate twin, docs/twin.md); one stream's pins the prefill alone
    if conc == 1:
        figures.append(Figure(label, load, "ttft_s", ttft))
    if streams is not None and cycle > 0:  # a closed loop's steady tokens/s: N x O per cycle
        figures.append(Figure(label, load, "output_tok_s", conc * o / cycle))
    return figures, None


def _wave(sent: list[float], ttft: float, streams: int) -> int:
    """How many of a closed loop's streams send together (0: all of them). Streams started
    together stay in step unless something spreads them (async scheduling on the twin,
    stalls): a wave's prompts are prefilled over about its TTFT, so sends less than the
    median TTFT apart are one wave, and the wave a request was in is weighed by its
    requests (eleven streams in step and one apart are a wave of about ten, not six). The
    steady state's first and last waves are cut by its edges, so only the waves between them
    count; a steady state that holds fewer than two whole says nothing against the start's one
    wave (a stage of 2.5 x its streams' requests held one)."""
    if streams <= 1 or len(sent) < 2:
        return 0
    times = sorted(sent)
    sizes = [1]
    for a, b in itertools.pairwise(times):
        if b - a > ttft:
            sizes.append(1)
        else:
            sizes[-1] += 1
    inner = sizes[1:-1]
    if len(inner) < 2:
        return 0
    wave = round(sum(n * n for n in inner) / sum(inner))
    return 0 if wave >= streams else max(1, wave)


def run_calibrate(ns: argparse.Namespace) -> int:
    try:
        arch = resolve_model(ns.model, ns.layers)
        gpu = lookup_gpu(ns.gpu)
    except SizingError as e:
        raise CliError(str(e)) from None
    batched = ns.max_num_batched_tokens or gpu.batched_tokens * ns.tp
    max_seqs = ns.max_num_seqs or default_max_num_seqs(gpu)
    if ns.run:
        figures, skipped, scale, source = _from_runs(ns.run, batched, max_seqs)
    else:
        figures, skipped, scale, source = _from_server(ns, batched, max_seqs)
    base = "wall" if scale == 1.0 else f"the twin's simulated seconds (time scale {scale:g})"
    try:
        robust = None if ns.run else SERVER_ROBUST
        cal = calibrate(arch, gpu, ns.tp, ns.kv_dtype, figures, source, base, robust)
    except CalibrationError as e:
        hint = f" ({'; '.join(skipped[:3])})" if skipped and not ns.run else ""
        raise CliError(f"{e}{hint}") from None
    cal = replace(
        cal, created=datetime.now(UTC).isoformat(timespec="seconds"), notes=cal.notes + skipped
    )
    doc = cal.to_dict()
    if ns.out:
        try:
            ns.out.write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as e:
            raise CliError(f"cannot write {ns.out}: {e.strerror or e}") from None
    if ns.json:
        print(json.dumps(doc, indent=1))
    else:
        for line in render(cal):
            print(line)
    return 0


def _from_runs(
    runs: list[Path], batched: int, max_seqs: int
) -> tuple[list[Figure], list[str], float, str]:
    figures: list[Figure] = []
    skipped: list[str] = []
    scales = set()
    for run_dir in runs:
        more, scale, why = figures_from_run(run_dir, batched, max_seqs)
        figures += more
        skipped += [f"{run_dir}: {w}" for w in why]
        scales.add(scale)
    if len(scales) > 1:
        raise CliError("the runs were made at different time scales; calibrate them apart")
    return figures, skipped, scales.pop(), "run " + ", ".join(str(r) for r in runs)


def _from_server(
    ns: argparse.Namespace, batched: int, max_seqs: int
) -> tuple[list[Figure], list[str], float, str]:
    """A live server's slices (`--metrics`) or its history (`--prometheus`), as figures."""
    from kvwatch.advise.prometheus import prometheus_as_cli
    from kvwatch.advise.server_readings import from_sidecar, slices_from_prometheus, watch
    from kvwatch.sidecar.contract.catalogue import duration_seconds
    from kvwatch.timing.server_slices import figures_from_slices

    scale = 1.0
    if ns.metrics:
        slice_s = ns.slice or 10.0
        if ns.watch < 2 * slice_s:
            raise CliError(f"--watch {ns.watch:g} s holds no two slices of {slice_s:g} s")
        print(f"watching {ns.metrics} for {ns.watch:g} s (Ctrl-C ends early)", file=sys.stderr)
        per_engine, scale, notes = watch(
            ns.metrics, ns.watch, ns.interval, slice_s, lambda m: print(m, file=sys.stderr)
        )
        source = f"metrics {ns.metrics}, {slice_s:g} s slices"
    elif ns.sidecar:
        slice_s = ns.slice or 10.0
        per_engine, scale, notes = from_sidecar(ns.sidecar, slice_s)
        source = f"sidecar {ns.sidecar}, {slice_s:g} s slices"
    else:
        slice_s = ns.slice or 60.0
        window_s = duration_seconds(ns.window)
        if window_s < 2 * slice_s:
            raise CliError(f"--window {ns.window} holds no two slices of {slice_s:g} s")
        if window_s / slice_s > _PROMETHEUS_POINTS:
            raise CliError(
                f"--window {ns.window} in slices of {slice_s:g} s is {window_s / slice_s:,.0f} "
                f"points; Prometheus answers at most {_PROMETHEUS_POINTS:,} a series: raise "
                "--slice or shorten --window"
            )
        try:
            with prometheus_as_cli():
                per_engine, notes = slices_from_prometheus(
                    ns.prometheus, window_s, slice_s, ns.instance
                )
        except SizingError as e:
            raise CliError(str(e)) from None
        source = f"prometheus {ns.prometheus}, last {ns.window} in {slice_s:g} s slices"
    if len(per_engine) > 1:
        notes.append(f"{len(per_engine)} engines pooled (one deployment, one model)")
    figures: list[Figure] = []
    for name, slices in per_engine.items():
        more, why = figures_from_slices(slices, batched, max_seqs)
        figures += more
        notes += [f"{name}: {w}" for w in why]
    return figures, notes, scale, source


def render(cal: Calibration) -> list[str]:
    e = cal.error
    lines = [
        f"calibration of {cal.model} on {cal.gpu} TP{cal.tp} from {cal.source} "
        f"(times: {cal.time_base})",
        f"  {len(cal.figures)} figures; the fit is a median {e['median_abs']:.1%} off, "
        f"at most {e['max_abs']:.1%}",
        "  constants:",
        *[f"    {k} = {v:.4g}" for k, v in cal.constants.items()],
    ]
    if cal.not_pinned:
        lines.append("  not pinned by these loads (left at the model's defaults):")
        lines += [f"    {k}: {why}" for k, why in cal.not_pinned.items()]
    lines.append("  figures (measured -> predicted):")
    for f in cal.figures:
        lines.append(
            f"    {f['label']}, {f['metric']}: {_value(f['metric'], f['measured'])} -> "
            f"{_value(f['metric'], f['predicted'])} ({f['error']:+.1%})"
        )
    lines += [f"  note: {n}" for n in cal.notes]
    return lines


def _value(metric: str, v: float) -> str:
    return f"{v:,.0f} tokens/s" if metric == "output_tok_s" else f"{v * 1e3:,.2f} ms"
