"""`kvwatch alerts`: write (or print) the Prometheus rules this project generates."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvwatch.command import add_threshold_option, thresholds_from

__all__ = ["register"]

DEFAULT_DIR = Path(__file__).resolve().parent


def register(sub: Any) -> None:
    a = sub.add_parser(
        "alerts",
        help="write the Prometheus rules (plain rules file and Kubernetes PrometheusRule)",
        description="Render kvwatch's recording and alerting rules from the thresholds the "
        "sidecar judges by. Writes kvwatch-rules.yaml and kvwatch-prometheusrule.yaml.",
    )
    a.add_argument("--out", type=Path, default=DEFAULT_DIR, help="directory (default: alerts/)")
    a.add_argument(
        "--print", dest="print_", choices=["rules", "k8s"], help="print one file instead of writing"
    )
    add_threshold_option(a, "override a threshold (as for kvwatch sidecar)")
    a.add_argument("--runbook-base-url", help="where runbook_url links point")
    a.add_argument(
        "--for-scale",
        type=float,
        default=1.0,
        help="multiply every `for:` (e.g. 0.01 in a lab to see alerts fire in seconds)",
    )
    a.set_defaults(func=_alerts)


def _alerts(ns: argparse.Namespace) -> int:
    from kvwatch.alerts.build import render_prometheus_rule, render_rules, write_all

    th = thresholds_from(ns)
    if ns.runbook_base_url:
        th = replace(th, runbook_base_url=ns.runbook_base_url)
    if ns.print_:
        text = (
            render_rules(th, ns.for_scale) if ns.print_ == "rules" else render_prometheus_rule(th)
        )
        sys.stdout.write(text)
        return 0
    for path in write_all(ns.out, th):
        print(path)
    return 0
