"""`kvwatch sidecar` (watch a live server) and `kvwatch logs` (read a vLLM log after the fact)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvwatch.common.command import (
    EXIT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    CliError,
    http_url,
    positive_finite,
)
from kvwatch.sidecar.contract.threshold_option import add_threshold_option, thresholds_from

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
        "follows its KV groups (sliding windows, MLA, states); checked against the server's "
        "own figures, a mismatch shows as model_error in /api/state",
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
    s.set_defaults(func=_sidecar)

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
    g.set_defaults(func=_logs)


def _default_db() -> Path:
    return Path.home() / ".local" / "state" / "kvwatch" / "sidecar.db"


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"--listen wants HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _sidecar(ns: argparse.Namespace) -> int:
    from kvwatch.sidecar.daemon import SidecarConfig, run_sidecar
    from kvwatch.sidecar.outputs.webhooks import load_receivers
    from kvwatch.sidecar.store.database import check_database

    command = tuple(a for a in ns.command if a != "--") if ns.command else ()
    host, port = _listen(ns.listen)
    overrides = []
    if ns.short_window is not None:
        overrides.append(f"short_window_s={ns.short_window}")
    if ns.long_window is not None:
        overrides.append(f"long_window_s={ns.long_window}")
    model = None
    if ns.model:
        from kvwatch.sizing.kvmath import resolve_model

        try:
            model = resolve_model(ns.model)
        except ValueError as e:
            raise CliError(f"--model: {e}") from None
    try:
        cfg = SidecarConfig(
            targets=tuple(ns.target),
            interval_s=ns.interval,
            timeout_s=ns.timeout,
            listen_host=host,
            listen_port=port,
            log_path=ns.log,
            log_from_start=ns.log_from_start,
            command=command,
            thresholds=thresholds_from(ns, overrides),
            db_path=Path(ns.db) if ns.db else None,
            receivers=tuple(load_receivers(ns.webhook, ns.webhook_config)),
            model=model,
            scheduling_policy=ns.scheduling_policy,
        )
        if cfg.db_path is not None:
            check_database(cfg.db_path)  # before anything is started or changed
    except ValueError as e:
        raise CliError(str(e)) from None
    import sqlite3

    try:
        return run_sidecar(cfg)
    except OSError as e:
        raise CliError(f"cannot start: {e}", EXIT_UNREACHABLE) from None
    except sqlite3.DatabaseError as e:
        raise CliError(f"--db {cfg.db_path}: {e}") from None


def _logs(ns: argparse.Namespace) -> int:
    from kvwatch.sidecar.logs.follow import FollowStats, read_line_chunks
    from kvwatch.sidecar.logs.logformats import event_to_dict, parse_text
    from kvwatch.sidecar.logs.logsummary import render_summary, summarize

    try:
        fh = sys.stdin.buffer if str(ns.file) == "-" else open(ns.file, "rb")  # noqa: SIM115
    except OSError as e:
        raise CliError(f"cannot read {ns.file}: {e.strerror}") from None
    stats = FollowStats()
    events = []
    with fh:
        try:
            for text in read_line_chunks(fh, stats):
                for ev in parse_text(text):
                    events.append(ev)
                    if ns.json:
                        sys.stdout.write(json.dumps(event_to_dict(ev)) + "\n")
        except OSError as e:
            raise CliError(
                f"cannot read {ns.file} past byte {stats.bytes:,}: {e.strerror or e}"
            ) from None
    lines = stats.lines + stats.oversized_lines
    summary = summarize(events, lines)
    if ns.json:
        for incident in summary.incidents:
            sys.stdout.write(json.dumps(incident.to_dict()) + "\n")
        print(json.dumps({"kind": "summary", **summary.to_dict()}))
    else:
        print(render_summary(summary))
    return EXIT_FOUND if summary.went_wrong else EXIT_OK
