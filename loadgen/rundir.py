"""The run directory: everything a run produced, so every figure can be recomputed later.

spec.json          what was asked: target, stages, workload, seed, SLOs
requests.jsonl     one record per request (times in seconds from the run's start)
requests.parquet   the same records as a table (pandas + pyarrow)
events.jsonl       stage starts and ends, for the sidecar, the report and dashboard annotations
summary.json       per stage and overall
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["write_run", "read_records"]


def write_run(run_dir: Path, spec: dict[str, Any], records: list[dict[str, Any]],
              events: list[dict[str, Any]], summary: dict[str, Any]) -> None:  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    with (run_dir / "requests.jsonl").open("w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    with (run_dir / "events.jsonl").open("w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    pd.DataFrame.from_records(records).to_parquet(run_dir / "requests.parquet", index=False)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    with (run_dir / "requests.jsonl").open() as fh:
        return [json.loads(line) for line in fh if line.strip()]
