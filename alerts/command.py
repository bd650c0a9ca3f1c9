"""The parsers of `kvwatch alerts` (write or print the Prometheus rules this project generates)
and `kvwatch runbook` (print the runbook the rules point to); their handlers are in run.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler, positive_finite
from kvwatch.sidecar.contract.threshold_option import add_threshold_option

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
    a.set_defaults(func=handler("kvwatch.alerts.run:run_alerts"))

    r = sub.add_parser(
        "runbook",
        help="print the runbook for kvwatch's alerts, or one alert's section",
        description="Print the runbook shipped with kvwatch (what each alert means, what to "
        "check, what to change), or the section of one ALERT (its name, any case). Exit 2 for "
        "an alert the runbook does not know.",
    )
    r.add_argument("alert", nargs="?", metavar="ALERT", help="e.g. KvwatchThrashing")
    r.add_argument("--list", action="store_true", help="list the alerts it has sections for")
    r.set_defaults(func=handler("kvwatch.alerts.run:run_runbook"))
