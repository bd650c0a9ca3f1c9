"""The run directory: everything a run produced, so every figure can be recomputed later.

spec.json          what was asked: target, stages, workload, seed, SLOs
requests.jsonl     one record per request (times in seconds from the run's start)
requests.parquet   the same records as a table (pandas + pyarrow)
events.jsonl       stage starts and ends, for the sidecar, the report and dashboard annotations
timeline.jsonl     the server's /metrics once a second (KV usage, queues, counters; with
                   --sidecar also the sidecar's state), unix time `t`
summary.json       per stage and overall

This module writes them; run_files.py reads them back as typed values.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

__all__ = [
    "prepare_run_dir", "discard_if_empty", "write_run", "read_records", "read_jsonl",
    "write_jsonl", "run_outcome",
]  # fmt: skip


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
