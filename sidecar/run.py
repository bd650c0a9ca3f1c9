"""The handlers of `kvwatch sidecar` and `kvwatch logs` (their parsers: command.py): each turns
its parsed options into the work's typed config and imports that work only when it runs."""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_OK, EXIT_UNREACHABLE, CliError
from kvwatch.sidecar.contract.threshold_option import thresholds_from
from kvwatch.sidecar.kvevents.launch import AUTO, events_for_command

__all__ = ["run_sidecar", "run_logs"]


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"--listen wants HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _check_kv_event_packages() -> None:
    """--kv-events reads ZMQ and msgpack: say so at the start, not in a loop that retries."""
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as e:
        raise CliError(
            f"--kv-events needs pyzmq and msgspec ({e}): pip install 'kvwatch[kvevents]'"
        ) from None


def run_sidecar(ns: argparse.Namespace) -> int:
    from kvwatch.sidecar.daemon import SidecarConfig, serve_sidecar
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
    kv_events, kv_replay = list(ns.kv_events), list(ns.kv_events_replay)
    private = None
    if AUTO in kv_events:
        if not command or kv_events != [AUTO] or kv_replay:
            raise CliError("--kv-events auto goes alone, with the vLLM command after --")
        private = Path(tempfile.mkdtemp(prefix="kvwatch-kv-events-"))  # 0700, ours alone
        atexit.register(shutil.rmtree, private, True)
        try:
            command, events, replay = events_for_command(command, private)
        except ValueError as e:
            raise CliError(str(e)) from None
        kv_events, kv_replay = [events], [] if replay is None else [replay]
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
            kv_events=tuple(kv_events),
            kv_events_replay=tuple(kv_replay),
        )
        if cfg.db_path is not None:
            check_database(cfg.db_path)  # before anything is started or changed
        if cfg.kv_events:
            _check_kv_event_packages()
    except ValueError as e:
        raise CliError(str(e)) from None
    import sqlite3

    try:
        return serve_sidecar(cfg)
    except OSError as e:
        raise CliError(f"cannot start: {e}", EXIT_UNREACHABLE) from None
    except sqlite3.DatabaseError as e:
        raise CliError(f"--db {cfg.db_path}: {e}") from None


def run_logs(ns: argparse.Namespace) -> int:
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
