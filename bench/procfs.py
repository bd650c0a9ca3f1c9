"""A process's CPU time and status fields from /proc, for the benchmarks (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "status_kb"]


def cpu_seconds(pid: int) -> float:
    """User plus system time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    """A field of /proc/PID/status (VmRSS, VmHWM in kB; Threads a count); -1 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1
