"""`kvwatch alerts`: write (or print) the Prometheus rules this project generates;
`kvwatch runbook`: print the runbook the rules point to."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvwatch.common.command import CliError, os_error, positive_finite
from kvwatch.sidecar.contract.threshold_option import add_threshold_option, thresholds_from
from kvwatch.sidecar.contract.thresholds import Thresholds

__all__ = ["register"]


def register(sub: Any) -> None:
    a = sub.add_parser(
        "alerts",
        help="write the Prometheus rules (plain rules file and Kubernetes PrometheusRule)",
        description="Render kvwatch's recording and alerting rules from the thresholds the "
        "sidecar judges by. Writes kvwatch-rules.yaml, kvwatch-prometheusrule.yaml, the "
        "Alertmanager routing that pages once per engine or per model "
        "(kvwatch-alertmanager.yml) and a KEDA ScaledObject (kvwatch-keda-scaledobject.yaml).",
    )
    a.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        help="directory to write into (default: the current one; `--out alerts` regenerates "
        "the copies in a kvwatch checkout)",
    )
    a.add_argument(
        "--chart",
        type=Path,
        metavar="DIR",
        help="also write the Helm chart's generated parts into the chart at DIR (its rules "
        "file and KEDA template; `--chart deploy/helm/vllm-kvwatch` in a kvwatch checkout)",
    )
    a.add_argument(
        "--print", dest="print_", choices=["rules", "k8s"], help="print one file instead of writing"
    )
    add_threshold_option(a, "override a threshold (as for kvwatch sidecar)")
    a.add_argument(
        "--runbook-base-url",
        metavar="URL",
        help="where runbook_url links point (the same as --threshold runbook_base_url=URL): "
        "your own copy of alerts/runbook.md; each alert links to URL#alertname",
    )
    a.add_argument(
        "--for-scale",
        type=positive_finite,
        default=1.0,
        help="multiply every `for:` (e.g. 0.01 in a lab to see alerts fire in seconds)",
    )
    a.set_defaults(func=_alerts)

    r = sub.add_parser(
        "runbook",
        help="print the runbook for kvwatch's alerts, or one alert's section",
        description="Print the runbook shipped with kvwatch (what each alert means, what to "
        "check, what to change), or the section of one ALERT (its name, any case). Exit 2 for "
        "an alert the runbook does not know.",
    )
    r.add_argument("alert", nargs="?", metavar="ALERT", help="e.g. KvwatchThrashing")
    r.add_argument("--list", action="store_true", help="list the alerts it has sections for")
    r.set_defaults(func=_runbook)


def _alerts(ns: argparse.Namespace) -> int:
    from kvwatch.alerts.build import render_prometheus_rule, render_rules, write_all

    th = thresholds_from(ns)
    if ns.runbook_base_url:
        th = replace(th, runbook_base_url=ns.runbook_base_url)
    if ns.print_:
        text = (
            render_rules(th, ns.for_scale)
            if ns.print_ == "rules"
            else render_prometheus_rule(th, ns.for_scale)
        )
        sys.stdout.write(text)
        return 0
    if ns.chart is not None and not (ns.chart / "Chart.yaml").is_file():
        raise CliError(f"--chart {ns.chart}: no Chart.yaml there (deploy/helm/vllm-kvwatch is one)")
    try:
        written = write_all(ns.out, th, ns.for_scale)
        if ns.chart is not None:
            written += _write_chart(ns.chart, th)
    except OSError as e:
        raise os_error("write", e) from None
    for path in written:
        print(path)
    return 0


def _write_chart(chart: Path, th: Thresholds) -> list[Path]:
    from kvwatch.alerts.chart import chart_files

    written = []
    for name, text in chart_files(th).items():
        (chart / name).parent.mkdir(parents=True, exist_ok=True)
        (chart / name).write_text(text)
        written.append(chart / name)
    return written


def _runbook(ns: argparse.Namespace) -> int:
    from kvwatch.alerts.runbook import read_runbook, section, sections

    text = read_runbook()
    if ns.list:
        print("\n".join(sections(text)))
        return 0
    if ns.alert is None:
        sys.stdout.write(text)
        return 0
    found = section(text, ns.alert)
    if found is None:
        raise CliError(
            f"the runbook has no section for {ns.alert!r}; it has: {', '.join(sections(text))}"
        )
    sys.stdout.write(found)
    return 0
