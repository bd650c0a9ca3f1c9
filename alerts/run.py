"""The handlers of `kvwatch alerts` (write or print the rules) and `kvwatch runbook` (print it,
or one alert's section); their parsers are in command.py."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from kvwatch.common.cli_kit import CliError, os_error
from kvwatch.sidecar.contract.threshold_option import thresholds_from
from kvwatch.sidecar.contract.thresholds import Thresholds

__all__ = ["run_alerts", "run_runbook"]


def run_alerts(ns: argparse.Namespace) -> int:
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


def run_runbook(ns: argparse.Namespace) -> int:
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
