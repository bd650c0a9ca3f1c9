"""The handler of `kvwatch dashboards`: write or print the dashboards (its parser: command.py)."""

from __future__ import annotations

import argparse
import sys

from kvwatch.common.cli_kit import os_error
from kvwatch.sidecar.contract.threshold_option import thresholds_from

__all__ = ["run_dashboards"]


def run_dashboards(ns: argparse.Namespace) -> int:
    from kvwatch.dashboards.build import render, write_all

    th = thresholds_from(ns)
    if ns.print_:
        sys.stdout.write(render(ns.print_, th))
        return 0
    try:
        written = write_all(ns.out, th)
    except OSError as e:
        raise os_error("write", e) from None
    for path in written:
        print(path)
    return 0
