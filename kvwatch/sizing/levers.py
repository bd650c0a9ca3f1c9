"""vLLM's flags against preemption, and the release each first appeared in.

Read from the released wheels' `config/scheduler.py` and `engine/arg_utils.py` (docs/sizing.md):
advice names a flag only when the server's version has it, and says which version it advised
for. Flags every release kvwatch reads has (--max-num-seqs, --gpu-memory-utilization, ...) are
not listed. A server whose version is unknown is advised for the newest release kvwatch knows,
and the advice says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Version",
    "parse_version",
    "valid_version",
    "Flag",
    "FLAGS",
    "NEWEST_KNOWN",
    "has_flag",
    "ServerInfo",
]

Version = tuple[int, int, int]
NEWEST_KNOWN: Version = (0, 33, 0)


def valid_version(v: object) -> str | None:
    """A version string as vLLM writes them (0.32.0, 0.10.1.1, 0.11.0rc2+cu128), else None:
    `/version` bodies and log lines come from outside."""
    if isinstance(v, str) and len(v) <= 64 and re.fullmatch(r"\d+\.\d+[\w.+-]*", v):
        return v
    return None


def parse_version(text: str | None) -> Version | None:
    """`0.32.0`, `0.10.1.1`, `0.11.0rc2+cu128` -> (major, minor, patch); None if not one."""
    if not text:
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True)
class Flag:
    name: str
    since: Version  # the first release whose wheel has it


FLAGS = {
    f.name: f
    for f in (
        # pinned by reading the wheels of 0.12, 0.15-0.26, 0.30, 0.31 and 0.33
        Flag("--kv-offloading-size", (0, 12, 0)),  # present in 0.12.0 (vllm-facts: 0.12+)
        Flag("--scheduler-reserve-full-isl", (0, 19, 0)),
        Flag("--watermark", (0, 24, 0)),
        Flag("--max-num-active-seqs", (0, 31, 0)),
    )
}


def has_flag(flag: str, version: Version | None) -> bool:
    return (version or NEWEST_KNOWN) >= FLAGS[flag].since


@dataclass(frozen=True)
class ServerInfo:
    """What kvwatch knows of one server: its version (from `GET /version` or the log's banner)
    and the settings its log says it was started with beyond vLLM's defaults."""

    version: str | None = None
    args: tuple[tuple[str, str], ...] = ()

    @property
    def parsed(self) -> Version | None:
        return parse_version(self.version)

    def arg(self, name: str) -> str | None:
        """A non-default arg as the log wrote it (`'False'`, `'0.1'`), or None if not given."""
        return next((v for k, v in self.args if k == name), None)

    @property
    def scheduling_policy(self) -> str | None:
        """`priority` or `fcfs` as the log's `scheduling_policy` says (a string, or an enum's
        repr in releases that logged one); None where the log does not say (vLLM's default,
        fcfs, is never among the non-default args)."""
        raw = (self.arg("scheduling_policy") or "").lower()
        return next((p for p in ("priority", "fcfs") if p in raw), None)

    def describe(self) -> str:
        v = (
            f"vLLM {self.version}"
            if self.version
            else ("an unknown vLLM version (advised for {}.{}.{})".format(*NEWEST_KNOWN))
        )
        given = ", ".join(f"{k}={v}" for k, v in self.args if k not in _NOISE)
        return v + (f"; started with {given}" if given else "")


_NOISE = {"host", "port", "model", "served_model_name", "api_key"}
