"""The run directory: everything a run produced, so every figure can be recomputed later.

spec.json          what was asked: target, stages, workload, seed, SLOs
requests.jsonl     one record per request (times in seconds from the run's start)
requests.parquet   the same records as a table (pandas + pyarrow)
events.jsonl       stage starts and ends, for the sidecar, the report and dashboard annotations
timeline.jsonl     the server's /metrics once a second (KV usage, queues, counters; with
                   --sidecar also the sidecar's state), unix time `t`
summary.json       per stage and overall
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.loadgen.results.run_schema import (
    EVENT,
    RECORD,
    SPEC,
    SUMMARY,
    TIMELINE_ROW,
    Cleaned,
    clean,
)
from kvwatch.sidecar.judge.signals import cached_share
from kvwatch.sizing.advice import Observed, kv_bytes_per_token_from, several_groups_note
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.levers import ServerInfo, valid_version

__all__ = [
    "RunFiles", "read_run", "prepare_run_dir", "discard_if_empty", "write_run", "read_records",
    "read_jsonl", "write_jsonl", "run_outcome", "observed_from_run", "server_from_run",
]  # fmt: skip


@dataclass(frozen=True)
class RunFiles:
    """A run directory as its readers see it: every file shaped by run_schema (a value of the
    wrong type is absent, and counted in `dropped`)."""

    spec: dict[str, Any]
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    alerts: list[Any]
    dropped: int


def read_run(run_dir: Path) -> RunFiles:
    """Read and check a run directory. ValueError, one line: not a run directory (a file is
    missing or unreadable), or a file that is not JSON."""

    def optional(name: str) -> list[Any]:
        path = run_dir / name
        return read_jsonl(path) if path.exists() else []

    try:
        spec = json.loads((run_dir / "spec.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        records = read_records(run_dir)
        events, timeline = optional("events.jsonl"), optional("timeline.jsonl")
        alerts = optional("alerts.jsonl")
    except OSError as e:
        raise ValueError(f"{run_dir} is not a run directory ({e.strerror}: {e.filename})") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{run_dir}: unreadable run files ({str(e)[:200]})") from None
    count = Cleaned()
    return RunFiles(
        spec=clean(spec, SPEC, count),
        summary=clean(summary, SUMMARY, count),
        records=[r for r in clean(records, [RECORD], count) if r],
        events=[e for e in clean(events, [EVENT], count) if e],
        timeline=[r for r in clean(timeline, [TIMELINE_ROW], count) if r],
        alerts=alerts,
        dropped=count.dropped,
    )


def prepare_run_dir(run_dir: Path) -> bool:
    """Create the run directory and prove it can be written, before the first request: a
    mistyped or read-only `--run-dir` found after the load would lose the whole run. True when
    this made it (`discard_if_empty` takes it back if the run fails before writing).
    ValueError: one line naming the directory and why."""
    try:
        existed = run_dir.is_dir()
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvwatch-probe-", dir=run_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
    return not existed


def discard_if_empty(run_dir: Path) -> None:
    """Remove a run directory that a failed run left empty (a run that wrote nothing leaves no
    trace in the user's folder)."""
    with suppress(OSError):
        run_dir.rmdir()


def write_run(run_dir: Path, spec: dict[str, Any], records: list[dict[str, Any]],
              events: list[dict[str, Any]], summary: dict[str, Any],
              timeline: Sequence[dict[str, Any]] = ()) -> None:  # fmt: skip
    """The run's files. The JSON ones come first and hold everything: the Parquet copy of the
    records is a convenience, and a value it cannot store (an int past 64 bits) once crashed
    the write before summary.json, losing the run; it is now left out with a line saying so."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    for name, rows in (("requests", records), ("events", events), ("timeline", timeline)):
        write_jsonl(run_dir / f"{name}.jsonl", rows)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    import pandas as pd  # the loadgen extra; reading a run never needs it

    try:
        pd.DataFrame.from_records(records).to_parquet(run_dir / "requests.parquet", index=False)
    except (OverflowError, ValueError, TypeError, NotImplementedError) as e:
        (run_dir / "requests.parquet").unlink(missing_ok=True)
        why = " ".join(str(e).split())[:200]
        print(f"kvwatch: requests.parquet not written ({why}); requests.jsonl holds every "
              "record", file=sys.stderr)  # fmt: skip


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "requests.jsonl")


def run_outcome(run_dir: Path) -> dict[str, float]:
    """The figures a sizing change is judged by: server-side preemptions during the run,
    completed output tokens per second, end-to-end p99 and client-seen stalls (those while the
    server preempted: NaN when not judged)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    overall = summary["overall"]
    return {
        "preemptions": float(summary["server"]["preemptions"]),
        "output_token_throughput": float(overall["output_token_throughput"]),
        "e2e_p99": float(overall["e2e"]["p99"]),
        "stalls": float(overall["stalls"]),
        "stalls_preempting": float(
            "nan" if overall.get("stalls_preempting") is None else overall["stalls_preempting"]
        ),
    }


def _first(record: dict[str, Any], *keys: str) -> float:
    """The first of the record's fields that is a positive count (0 when none is)."""
    for k in keys:
        v = record.get(k)
        if v is not None and v > 0:
            return float(v)
    return 0.0


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


def server_from_run(run_dir: Path) -> ServerInfo:
    """The server's version as the run recorded it before the load (None: not recorded)."""
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
    except (OSError, ValueError):
        return ServerInfo()
    before = spec.get("server_before") if isinstance(spec, dict) else None
    version = before.get("version") if isinstance(before, dict) else None
    return ServerInfo(version=valid_version(version))


def observed_from_run(run_dir: Path) -> Observed:
    """What a recorded run says about the load, as `kvwatch advise` reads it."""
    try:
        run = read_run(run_dir)
    except ValueError as e:
        raise SizingError(str(e)) from None
    spec, records = run.spec, run.records
    cache = (spec.get("server_before") or {}).get("cache") or {}
    if not (cache.get("num_blocks") or 0) > 0 or not (cache.get("block_size") or 0) > 0:
        raise SizingError(
            f"{run_dir}: the run recorded no server KV configuration "
            "(vLLM /metrics with cache_config_info was not readable)"
        )
    lengths = sorted(
        int(_first(r, "prompt_tokens", "expected_input_tokens"))
        + int(_first(r, "output_tokens", "expected_output_tokens"))
        for r in records
    )
    if not lengths:
        raise SizingError(f"{run_dir}: no requests recorded")
    spans = [
        (r["sent_at"], r["finished_at"])
        for r in records
        if r.get("sent_at") is not None and r.get("finished_at") is not None
    ]
    p95 = _p95(lengths)
    prompt_p95 = _p95(
        sorted(int(_first(r, "prompt_tokens", "expected_input_tokens")) for r in records)
    )
    mem = cache.get("kv_cache_memory_bytes")
    blocks, bs = cache["num_blocks"], cache["block_size"]
    server = run.summary.get("server") or {}
    duration = max((e for _, e in spans), default=0) - min((s for s, _ in spans), default=0)
    return Observed(
        capacity_blocks=blocks,
        block_size=bs,
        kv_bytes_per_token=kv_bytes_per_token_from(mem, blocks, bs, "run"),
        peak_demand=_peak_overlap(spans),
        seq_len_p95=p95,
        seq_len_max=lengths[-1],
        preemptions=server.get("preemptions") or 0.0,
        duration_s=duration or None,
        gpu_memory_utilization=cache.get("gpu_memory_utilization"),
        kv_cache_memory_bytes=mem,
        kv_dtype=cache.get("cache_dtype") or "auto",
        ssm_state_dtype=cache.get("ssm_state_dtype"),
        source=f"run {run_dir}",
        prompt_len_p95=prompt_p95,
        notes=several_groups_note(blocks, bs, cache.get("kv_tokens"), cache.get("sliding_window"))
        + (
            (f"{run.dropped} values of the wrong type in the run files were left out",)
            if run.dropped
            else ()
        ),
        admission_rejections=server.get("admission_rejections"),
        offload_allocation_failures=server.get("offload_allocation_failures"),
        kv_offloading_gib=cache.get("kv_offloading_gib"),
        prompt_cache_hit_share=cached_share(
            server.get("prompt_tokens_cached"), server.get("prompt_tokens_computed")
        ),
    )
