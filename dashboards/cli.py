"""`kvwatch dashboards`: write (or print) the Grafana dashboards this project generates."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvwatch.command import add_threshold_option, thresholds_from

__all__ = ["register"]

DEFAULT_DIR = Path(__file__).resolve().parent


def register(sub: Any) -> None:
    from kvwatch.dashboards.build import DASHBOARDS

    d = sub.add_parser(
        "dashboards",
        help="write the Grafana dashboards (KV pressure, fleet) as JSON",
        description="Render kvwatch's Grafana dashboards from the metric vocabulary and the "
        "thresholds the sidecar judges by. Import the JSON in Grafana or provision it "
        "(docs/dashboards.md).",
    )
    d.add_argument("--out", type=Path, default=DEFAULT_DIR, help="directory (default: dashboards/)")
    d.add_argument("--print", dest="print_", choices=sorted(DASHBOARDS), help="print one instead")
    add_threshold_option(d, "override a threshold the panels draw (as for kvwatch sidecar)")
    d.set_defaults(func=_dashboards)


def _dashboards(ns: argparse.Namespace) -> int:
    from kvwatch.dashboards.build import render, write_all

    th = thresholds_from(ns)
    if ns.print_:
        sys.stdout.write(render(ns.print_, th))
        return 0
    for path in write_all(ns.out, th):
        print(path)
    return 0
