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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["write_run", "read_records", "read_jsonl", "write_jsonl", "run_outcome"]


def write_run(run_dir: Path, spec: dict[str, Any], records: list[dict[str, Any]],
              events: list[dict[str, Any]], summary: dict[str, Any],
              timeline: Sequence[dict[str, Any]] = ()) -> None:  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    for name, rows in (("requests", records), ("events", events), ("timeline", timeline)):
        write_jsonl(run_dir / f"{name}.jsonl", rows)
    pd.DataFrame.from_records(records).to_parquet(run_dir / "requests.parquet", index=False)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


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
