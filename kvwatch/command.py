"""`kvwatch demo`'s parser: the top package's own command.

Parsers only: the handler is imported when the command runs (`handler`), so listing the commands
loads none of the work behind them. `advise` and `calibrate` are registered by
`kvwatch/advise/command.py`, `report` by `kvwatch/report/command.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler, http_url, positive_int

__all__ = ["register"]


def register(sub: Any) -> None:
    _register_demo(sub)


def _register_demo(sub: Any) -> None:
    d = sub.add_parser(
        "demo",
        help="start a local vLLM, ramp it into thrashing, and watch, alert and advise",
        description="Build the tiny model, start vLLM (CPU) with a small KV cache, run the "
        "sidecar beside it with a webhook to a local receiver, ramp the load from healthy "
        "into thrashing with `kvwatch loadgen run`, show KV usage and preemptions live, "
        "print the alerts and the sizing advice, and write a run directory with report.html, "
        "the dashboards and the rules.",
    )
    d.add_argument(
        "--target",
        metavar="URL",
        type=http_url,
        help="use this running vLLM instead of starting one",
    )
    d.add_argument(
        "--kv-cache-bytes",
        type=positive_int,
        default=10 * 1024 * 1024,
        help="KV budget of the local server (default 10 MiB = 40 blocks)",
    )
    d.add_argument(
        "--twin",
        metavar="MODEL:GPU",
        help="run on the kvwatch twin (vLLM's own engine, simulated card; docs/twin.md) "
        "instead of the tiny CPU model, e.g. llama-3.1-8b:h100; --twin-blocks sizes its cache",
    )
    d.add_argument(
        "--twin-blocks",
        type=positive_int,
        default=400,
        help="KV blocks of the twin (400: the heavy stage outgrows them)",
    )
    d.add_argument(
        "--light", type=positive_int, default=2, help="concurrent streams, healthy stage (2)"
    )
    d.add_argument(
        "--heavy", type=positive_int, default=32, help="concurrent streams, heavy stage (32)"
    )
    d.add_argument("--max-tokens", type=positive_int, default=300, help="tokens per request (300)")
    d.add_argument(
        "--rounds", type=positive_int, default=1, help="heavy stages to run (1); more = longer"
    )
    d.add_argument("--run-dir", type=Path, help="where to write the run (default runs/demo-TIME)")
    d.add_argument(
        "--fleet",
        type=positive_int,
        metavar="N",
        help="run a fleet instead: N twins (--twin, default llama-3.1-8b:h100; --twin-blocks "
        "each) behind vllm-router, a sidecar each, Prometheus with kvwatch's rules and "
        "Alertmanager with its routing, ramped (streams x N) into a shortage; prints the pages "
        "and the fleet advice (docs/fleet.md)",
    )
    d.set_defaults(func=handler("kvwatch.demo:run_demo"))
