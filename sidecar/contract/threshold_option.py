"""`--threshold NAME=VALUE`, the one option by which `kvwatch sidecar`, `alerts` and
`dashboards` change a threshold: the same names and checks everywhere, so the rules a user
renders judge by what the sidecar judges by."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvwatch.common.cli_kit import CliError
from kvwatch.sidecar.contract.thresholds import Thresholds, parse_overrides

__all__ = ["add_threshold_option", "thresholds_from"]


def add_threshold_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=help)


def thresholds_from(ns: argparse.Namespace, extra: Sequence[str] = ()) -> Thresholds:
    """The thresholds `--threshold NAME=VALUE` (and `extra` overrides) ask for."""
    try:
        return parse_overrides([*ns.threshold, *extra])
    except ValueError as e:
        raise CliError(str(e)) from None
