"""What a recorded run says to the sizing advice: the load it held (`Observed`) and the server
it ran on (`ServerInfo`), from the run's typed files (run_files.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from kvwatch.loadgen.results.kv_events import KV_EVENTS_FILE, curve_from_recording
from kvwatch.loadgen.results.run_files import Record, RunFiles, read_run
from kvwatch.sidecar.judge.signals import cached_share
from kvwatch.sidecar.kvevents.recording import RecordingError
from kvwatch.sizing.advice import Observed, kv_bytes_per_token_from, several_groups_note
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.levers import ServerInfo, valid_version

__all__ = [
    "observed_from_files",
    "server_from_files",
    "observed_from_dir",
    "observed_from_run",
    "run_for_advice",
]


def server_from_files(run: RunFiles) -> ServerInfo:
    """The server's version as the run recorded it before the load (None: not recorded)."""
    return ServerInfo(version=valid_version(run.spec.server_before.version))


def _first(*values: float | None) -> float:
    """The first value that is a positive count (0 when none is)."""
    return next((float(v) for v in values if v is not None and v > 0), 0.0)


def _peak_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def _p95(ordered: list[int]) -> int:
    """The 95th percentile of sorted, non-empty values (the nearest rank)."""
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _prompt(r: Record) -> int:
    return int(_first(r.prompt_tokens, r.expected_input_tokens))


def observed_from_files(run: RunFiles) -> Observed:
    """What a recorded run says about the load, as `kvwatch advise` reads it."""
    run_dir, records = run.directory, run.records
    cache = run.spec.server_before.cache
    if not (cache.num_blocks or 0) > 0 or not (cache.block_size or 0) > 0:
        raise SizingError(
            f"{run_dir}: the run recorded no server KV configuration "
            "(vLLM /metrics with cache_config_info was not readable)"
        )
    lengths = sorted(
        _prompt(r) + int(_first(r.output_tokens, r.expected_output_tokens)) for r in records
    )
    if not lengths:
        raise SizingError(f"{run_dir}: no requests recorded")
    spans = [
        (r.sent_at, r.finished_at)
        for r in records
        if r.sent_at is not None and r.finished_at is not None
    ]
    blocks, bs = int(cache.num_blocks or 0), int(cache.block_size or 0)
    mem = cache.kv_cache_memory_bytes
    server = run.summary.server
    duration = max((e for _, e in spans), default=0) - min((s for s, _ in spans), default=0)
    kv_tokens = None if cache.kv_tokens is None else int(cache.kv_tokens)
    window = None if cache.sliding_window is None else int(cache.sliding_window)
    return Observed(
        capacity_blocks=blocks,
        block_size=bs,
        kv_bytes_per_token=kv_bytes_per_token_from(mem, blocks, bs, "run"),
        peak_demand=_peak_overlap(spans),
        seq_len_p95=_p95(lengths),
        seq_len_max=lengths[-1],
        preemptions=server.preemptions or 0.0,
        duration_s=duration or None,
        gpu_memory_utilization=cache.gpu_memory_utilization,
        kv_cache_memory_bytes=mem,
        kv_dtype=cache.cache_dtype or "auto",
        ssm_state_dtype=cache.ssm_state_dtype,
        source=f"run {run_dir}",
        prompt_len_p95=_p95(sorted(_prompt(r) for r in records)),
        notes=several_groups_note(blocks, bs, kv_tokens, window)
        + (
            (f"{run.dropped} values of the wrong type in the run files were left out",)
            if run.dropped
            else ()
        ),
        admission_rejections=server.admission_rejections,
        offload_allocation_failures=server.offload_allocation_failures,
        kv_offloading_gib=cache.kv_offloading_gib,
        prompt_cache_hit_share=cached_share(
            server.prompt_tokens_cached, server.prompt_tokens_computed
        ),
    )


def run_for_advice(run_dir: Path) -> RunFiles:
    """A run directory read for the advice; SizingError, one line, where it is not a run."""
    try:
        return read_run(run_dir)
    except ValueError as e:
        raise SizingError(str(e)) from None


def observed_from_dir(run_dir: Path) -> tuple[Observed, ServerInfo]:
    """A run directory read once for the advice: the load and the server. SizingError, one
    line, for a directory that is not a run or holds no figures to size from."""
    return observed_from_run(run_for_advice(run_dir))


def observed_from_run(run: RunFiles) -> tuple[Observed, ServerInfo]:
    """A run already read (`run_for_advice`): the load and the server, and the prefix cache's
    curve where the run recorded vLLM's KV events."""
    observed = observed_from_files(run)
    events = run.directory / KV_EVENTS_FILE
    if events.is_file():  # recorded with --kv-events: the prefix cache's curve
        try:
            curve, notes = curve_from_recording(events, observed.capacity_blocks)
        except RecordingError as e:
            raise SizingError(str(e)) from None
        observed = replace(observed, prefix_curve=curve, notes=(*observed.notes, *notes))
    return observed, server_from_files(run)
