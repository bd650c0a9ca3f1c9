"""The parser of `kvwatch dashboards` (write or print the Grafana dashboards this project
generates); its handler is in run.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler
from kvwatch.dashboards.files import DASHBOARD_FILES
from kvwatch.sidecar.contract.threshold_option import add_threshold_option

__all__ = ["register"]


def register(sub: Any) -> None:
    d = sub.add_parser(
        "dashboards",
        help="write the Grafana dashboards (KV pressure, fleet) as JSON",
        description="Render kvwatch's Grafana dashboards from the metric vocabulary and the "
        "thresholds the sidecar judges by. Import the JSON in Grafana or provision it "
        "(docs/dashboards.md).",
    )
    d.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        help="directory to write into (default: the current one; `--out dashboards` "
        "regenerates the copies in a kvwatch checkout)",
    )
    d.add_argument(
        "--print", dest="print_", choices=DASHBOARD_FILES, help="print one instead of writing"
    )
    add_threshold_option(d, "override a threshold the panels draw (as for kvwatch sidecar)")
    d.set_defaults(func=handler("kvwatch.dashboards.run:run_dashboards"))
