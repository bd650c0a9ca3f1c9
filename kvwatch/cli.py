"""The one `kvwatch` command: each package registers its own subcommands here.

Exit codes scripts can rely on: 0 ok, 1 the job ran and found a problem (e.g. a failed check),
2 bad usage or bad input, 3 a server or target could not be reached or started, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvwatch import __version__

if TYPE_CHECKING:
    from sidecar.thresholds import Thresholds

__all__ = [
    "main",
    "CliError",
    "add_threshold_option",
    "thresholds_from",
    "EXIT_OK",
    "EXIT_FOUND",
    "EXIT_USAGE",
    "EXIT_UNREACHABLE",
]

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error the user can fix; printed without a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def add_threshold_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=help)


def thresholds_from(ns: argparse.Namespace, extra: Sequence[str] = ()) -> Thresholds:
    """The thresholds `--threshold NAME=VALUE` (and `extra` overrides) ask for."""
    from sidecar.thresholds import parse_overrides

    try:
        return parse_overrides([*ns.threshold, *extra])
    except ValueError as e:
        raise CliError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    from alerts import cli as alerts_cli
    from dashboards import cli as dashboards_cli
    from kvwatch import advise_cmd, demo, report
    from loadgen import cli as loadgen_cli
    from sidecar import cli as sidecar_cli

    parser = argparse.ArgumentParser(
        prog="kvwatch",
        description="Watch a vLLM server's KV cache, detect preemption thrashing, drive load, "
        "and size the cache.",
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo.register(sub)
    advise_cmd.register(sub)
    report.register(sub)
    alerts_cli.register(sub)
    dashboards_cli.register(sub)
    sidecar_cli.register(sub)
    loadgen_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(args)
    try:
        return int(ns.func(ns) or 0)
    except CliError as e:
        print(f"kvwatch: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `kvwatch advise ... | head`: the reader left, not an error
        sys.stderr.close()
        return EXIT_OK
