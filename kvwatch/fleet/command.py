"""`kvwatch fleet`: the parser only; the work is in `up.py`, imported when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler, positive_finite, positive_int

__all__ = ["register"]

_EPILOG = """examples:
  kvwatch fleet --replicas 3
  kvwatch fleet --replicas 2 --policy cache_aware --kv-blocks 4000 --work-dir runs/fleet
  kvwatch fleet --replicas 4 --time-scale 2 --rules-for-scale 0.05

Then drive it through the router (kvwatch loadgen run --url ROUTER ...), watch Prometheus and
the notifications Alertmanager sends, and read the fleet's advice (kvwatch advise --prometheus
PROMETHEUS). What each part is and the fleet rules: docs/fleet.md."""


def register(sub: Any) -> None:
    f = sub.add_parser(
        "fleet",
        help="start a fleet on this machine: twins behind vllm-router, a sidecar each, "
        "Prometheus with kvwatch's rules, Alertmanager",
        description="Start N replicas of one model on the kvwatch twin (vLLM's own engine on "
        "a simulated card), a kvwatch sidecar beside each, vllm-router in front of them, "
        "Prometheus discovering servers and sidecars from files with kvwatch's rules loaded, "
        "and Alertmanager with kvwatch's routing posting to a local receiver that prints each "
        "notification. Prints the URLs and runs until Ctrl-C or SIGTERM, then stops "
        "everything it started. Exit 3 if a part cannot start.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("--replicas", type=positive_int, default=2, help="replicas to start (2)")
    f.add_argument("--model", default="llama-3.1-8b", help="twin model preset (llama-3.1-8b)")
    f.add_argument("--gpu", default="h100", help="simulated card (h100)")
    f.add_argument(
        "--kv-blocks", type=positive_int, default=2000, help="KV blocks per replica (2000)"
    )
    f.add_argument(
        "--max-model-len", type=positive_int, default=8192, help="vLLM's --max-model-len"
    )
    f.add_argument(
        "--policy",
        default="round_robin",
        help="vllm-router policy: round_robin (default), cache_aware, power_of_two, random, "
        "consistent_hash",
    )
    f.add_argument(
        "--time-scale",
        type=positive_finite,
        default=1.0,
        help="wall seconds per simulated second for every twin (1); raise it when this "
        "machine's cores cannot keep N twins in real time",
    )
    f.add_argument(
        "--rules-for-scale",
        type=positive_finite,
        default=1.0,
        help="scale the rules' `for:` (1; a lab uses e.g. 0.05 to see pages in seconds)",
    )
    f.add_argument("--work-dir", type=Path, help="keep logs and discovery files here")
    f.set_defaults(func=handler("kvwatch.fleet.up:run_fleet"))
