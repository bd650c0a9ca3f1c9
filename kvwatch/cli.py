"""The one `kvwatch` command: each package's command module registers its subcommands here.

The command modules import only what their parsers need; each command imports its work when it
runs, so `kvwatch --help` and `kvwatch logs` start in a fraction of a second. Errors, exit codes
and the `--threshold` option live in the leaf `kvwatch.common.cli_kit`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence

from kvwatch import __version__
from kvwatch.common.cli_kit import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
    missing_extra,
    one_line,
)

__all__ = ["main", "build_parser", "COMMAND_MODULES", "without_httpx_cli"]

# Each module has `register(subparsers)`; the order is the order `--help` lists them in.
COMMAND_MODULES = (
    "kvwatch.command",
    "kvwatch.advise.command",
    "kvwatch.report.command",
    "kvwatch.alerts.command",
    "kvwatch.dashboards.command",
    "kvwatch.sidecar.command",
    "kvwatch.loadgen.command",
    "kvwatch.twin.command",
    "kvwatch.fleet.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvwatch",
        description="Watch a vLLM server's KV cache, detect preemption thrashing, drive load, "
        "and size the cache.",
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def without_httpx_cli() -> None:
    """Keep httpx's own command line out of this process. `import httpx` imports its CLI (rich,
    pygments, click) wherever those are installed, as beside vLLM: 6 MB of a sidecar's 61
    (#45's target is 60) and a third of its imports, for a command kvwatch never runs. httpx
    catches the ImportError this gives and its `main` says the CLI is missing."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    without_httpx_cli()
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(args)
    if threading.current_thread() is threading.main_thread():
        # the commands that run until Ctrl-C (fleet, twin, loadgen local, sidecar) say so: a
        # script's `&` leaves SIGINT ignored and Python keeps that, so `kill -INT` went unheard
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            return int(ns.func(ns) or 0)
        except ModuleNotFoundError as e:
            err = missing_extra(e, ns.command)
            if err is None:
                raise
            raise err from None
    except CliError as e:
        print(f"kvwatch: error: {one_line(str(e))}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `kvwatch advise ... | head`: the reader left, not an error
        sys.stderr.close()
        return EXIT_OK
