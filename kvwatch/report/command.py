"""`kvwatch report`: its parser; the pages are `run_page.py` and `capacity_page.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler

__all__ = ["register"]


def register(sub: Any) -> None:
    _register_report(sub)


def _register_report(sub: Any) -> None:
    r = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run directory",
        description="Render RUN_DIR/report.html (or --out): the workload, KV usage, preemptions "
        "and queues over time with thrashing shaded and load stages marked, per-request "
        "latency and stalls, preemptions per request, and the sizing advice with its "
        "arithmetic. On a `kvwatch loadgen search` directory, the capacity page instead: SLO "
        "attainment and preemptions per second against load, the SLO limit and the KV onset "
        "marked, and the advice at the binding point. Opens offline; no scripts.",
    )
    r.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR",
        help="a `kvwatch loadgen run`, `kvwatch loadgen search` or demo run",
    )  # fmt: skip
    r.add_argument("--out", type=Path, help="where to write (default RUN_DIR/report.html)")
    r.set_defaults(func=handler("kvwatch.report.run_page:run_report"))
