"""A process's CPU time and status fields from /proc, for the benchmarks (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "session_pids", "status_kb", "running"]


def _stat_fields(stat: Path) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses):
    [0] is the state, [3] the session, [11] and [12] user and system time."""
    return stat.read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User plus system time so far."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed process's entry may linger as one until reaped)."""
    try:
        return _stat_fields(Path(f"/proc/{pid}/stat"))[0] != "Z"
    except OSError:
        return False


def session_pids(session: int) -> list[int]:
    """The processes of a session (its leader and every process it started)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat)
        except OSError:  # it ended meanwhile
            continue
        if int(fields[3]) == session:
            out.append(int(stat.parent.name))
    return out


def status_kb(pid: int, key: str) -> int:
    """A field of /proc/PID/status (VmRSS, VmHWM in kB; Threads a count); -1 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1
