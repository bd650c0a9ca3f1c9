"""The parsers of `kvwatch sidecar` (watch a live server) and `kvwatch logs` (read a vLLM log
after the fact); their handlers are in run.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import handler, http_url, positive_finite
from kvwatch.sidecar.contract.threshold_option import add_threshold_option

__all__ = ["register"]


def register(sub: Any) -> None:
    s = sub.add_parser(
        "sidecar",
        help="watch vLLM servers' metrics and log, export kvwatch_* metrics and a JSON state",
        description="Run beside one or more vLLM servers: scrape their /metrics every --interval "
        "seconds, follow the server log (a file like tail -F, stdin with '--log -', or a vLLM "
        "command started after '--' whose output passes through unchanged), and serve "
        "/metrics (kvwatch_*), /healthz and /api/state. A log belongs to the first --target.",
        epilog="examples:\n"
        "  kvwatch sidecar --target http://127.0.0.1:8000 --log /var/log/vllm.log\n"
        "  kvwatch sidecar --target http://127.0.0.1:8000 -- vllm serve MODEL --port 8000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="URL",
        type=http_url,
        help="vLLM base URL (or full metrics URL); repeat for several servers",
    )
    s.add_argument(
        "--log", type=Path, metavar="FILE", help="vLLM log file to follow, or - for stdin"
    )
    s.add_argument(
        "--log-from-start",
        action="store_true",
        help="read the log file from its start (default: only new lines)",
    )
    s.add_argument(
        "--interval", type=positive_finite, default=1.0, help="seconds between scrapes (1)"
    )
    s.add_argument(
        "--timeout", type=positive_finite, default=2.0, help="scrape timeout in seconds (2)"
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:9477",
        metavar="HOST:PORT",
        help="where to serve kvwatch's own endpoint (127.0.0.1:9477)",
    )
    s.add_argument("--short-window", type=positive_finite, help="short rate window, s (10)")
    s.add_argument("--long-window", type=positive_finite, help="long rate window, s (60)")
    add_threshold_option(s, "override a detection threshold (see docs/detection.md); repeatable")
    s.add_argument(
        "--model",
        metavar="CONFIG|PRESET",
        help="the served model (its config.json, model directory or a preset): block demand "
        "follows its KV groups (sliding windows, MLA, states), and for a MoE the load "
        "forecast's step bends with the share of experts a batch reads; checked against the "
        "server's own figures, a mismatch shows as model_error in /api/state",
    )
    s.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        help="the servers' vLLM --scheduling-policy, where the sidecar does not read their log "
        "(with --log or a command it is read from the launch line). Under priority, the "
        "lowest-priority requests giving way is the policy at work: reported, not paged as "
        "thrashing (docs/detection.md)",
    )
    s.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="follow a server's KV events: the endpoint of vLLM's --kv-events-config publisher "
        "(e.g. tcp://127.0.0.1:5557). Gives the prefix cache's hit rate at 0.25x-4x its size, "
        "the ideal hit rate and the blocks stored again after eviction (docs/detection.md). "
        "One per --target, in the targets' order. 'auto' with a vLLM command after --: the "
        "sidecar turns the events on (on private Unix sockets) or follows the command's own "
        "--kv-events-config. Needs pyzmq (vLLM brings it)",
    )
    s.add_argument(
        "--kv-events-replay",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="the publisher's replay_endpoint, to recover batches lost in a gap (in the order "
        "of --kv-events)",
    )
    s.add_argument(
        "--db",
        default=str(_default_db()),
        metavar="FILE",
        help="SQLite file that keeps thrashing episodes across restarts "
        "(default ~/.local/state/kvwatch/sidecar.db; '' for memory only)",
    )
    s.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL[,FORMAT]",
        help="send alerts here; FORMAT json (default), alertmanager or slack",
    )
    s.add_argument(
        "--webhook-config",
        type=Path,
        metavar="FILE",
        help="receivers as a JSON/YAML list: url, format, name, secret_env (HMAC-SHA256 key "
        "from that environment variable), timeout_s, headers",
    )
    s.add_argument(
        "command", nargs=argparse.REMAINDER, help="after --: the vLLM command to start and read"
    )
    s.set_defaults(func=handler("kvwatch.sidecar.run:run_sidecar"))

    g = sub.add_parser(
        "logs",
        help="summarise a vLLM log: incidents, capacity, preemption warnings, KV usage over time",
        description="Read a vLLM server log (any version from 0.4 to 0.33) and say what happened: "
        "a timeline of incidents (the engine dying or failing to start, out of memory, a "
        "restart, KV load failures, failed health checks, preemption episodes, the cache full "
        "while requests wait), the KV capacity at start, preemption warnings (V0) and repeat "
        "victims, KV usage, running and waiting per minute. '-' reads stdin. Exit status: 0 "
        "when nothing went wrong, 1 when an incident other than a restart or saturation was "
        "logged, 2 on bad usage.",
    )
    g.add_argument("file", type=Path, help="log file, or - for stdin")
    g.add_argument(
        "--json",
        action="store_true",
        help="one JSON event per line, then one per incident (kind: incident, what, at), "
        "then a summary object",
    )
    g.set_defaults(func=handler("kvwatch.sidecar.run:run_logs"))


def _default_db() -> Path:
    return Path.home() / ".local" / "state" / "kvwatch" / "sidecar.db"
