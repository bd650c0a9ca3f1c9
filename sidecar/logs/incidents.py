"""Incidents in a vLLM log: the engine dying, failing to start, running out of memory, a restart,
KV loads failing, health checks failing, preemption episodes (V0's warnings) and saturation
(stats lines with the cache full while requests wait: V1 logs no preemption, so this is what a
V1 log can say about KV pressure).

Two parts, both pure:
- `incident_line` recognises one line (vLLM's own messages, read in its source, and the last
  line of a traceback: `SomeError: message`), for the log parser;
- `IncidentTracker` folds the events of a log, in order, into incidents: the fifty lines of one
  traceback (and the "see root cause above" lines that follow it) are one incident, named by
  the most telling line among them, with the first exception as its cause.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "What", "IncidentLine", "Incident", "IncidentTracker", "incident_line", "INCIDENT_NEEDLES",
    "GROUP_GAP_S", "EPISODE_GAP_S", "SATURATED_KV", "seconds_of",
]  # fmt: skip

# Lines of one incident come within this many seconds of each other (a traceback is logged at
# once; the API server's own report follows the engine's within a second or two).
GROUP_GAP_S = 10.0
# V0 preemption warnings (or full-cache stats lines) closer than this belong to one episode.
EPISODE_GAP_S = 60.0
# A stats line at this KV usage or more, with requests waiting, is the cache saturated (the
# line prints one decimal: 99.9% is as full as vLLM's rounding lets it say)
SATURATED_KV = 0.99


class What(StrEnum):
    """Kinds of incident, the most telling first: when one traceback holds several, the
    incident is named by the first of these it holds."""

    KV_CACHE_TOO_SMALL = "kv_cache_too_small"  # refused to start: max_model_len does not fit
    NO_CACHE_MEMORY = "no_cache_memory"  # refused to start: no memory left for KV blocks
    OUT_OF_MEMORY = "out_of_memory"
    STARTUP_FAILURE = "startup_failure"
    ENGINE_DEATH = "engine_death"
    KV_LOAD_FAILURE = "kv_load_failure"  # recovered (rescheduled) or requests failed
    CRASH = "crash"  # an uncaught exception that vLLM's messages do not name
    HEALTH_CHECK_FAILED = "health_check_failed"
    RESTART = "restart"  # a new startup banner in the same log
    STOP = "stop"  # a stop was asked for (SIGTERM, SIGINT): what the engine says next is no death
    PREEMPTION_EPISODE = "preemption_episode"
    SATURATION = "saturation"  # stats lines: the cache full while requests wait

    @property
    def rank(self) -> int:
        return list(What).index(self)

    @property
    def fatal(self) -> bool:
        """Whether the engine is gone after it (until the server starts again)."""
        return self in _FATAL

    @property
    def wrong(self) -> bool:
        """Whether it says something went wrong: not a restart (it may be a deploy), nor the
        cache full with a queue (a server at its limit, which is not yet a failure)."""
        return self not in (What.RESTART, What.STOP, What.SATURATION)


_FATAL = frozenset({
    What.KV_CACHE_TOO_SMALL, What.NO_CACHE_MEMORY, What.OUT_OF_MEMORY, What.STARTUP_FAILURE,
    What.ENGINE_DEATH,
})  # fmt: skip


# what still counts as an incident once a stop was asked for (the rest is the engine going away)
_REAL_WHILE_STOPPING = frozenset({
    What.KV_CACHE_TOO_SMALL, What.NO_CACHE_MEMORY, What.OUT_OF_MEMORY, What.STARTUP_FAILURE,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class IncidentLine:
    """One line that tells of an incident."""

    what: What
    detail: str
    logged_at: str | None = None
    max_model_len: int | None = None
    suggested_max_model_len: int | None = None  # what vLLM says would fit
    kind: str = "incident_line"


# vLLM's messages, newest wording first (vllm/v1/core/kv_cache_utils.py, v1/engine/core*.py,
# v1/core/sched/scheduler.py; V0's wording from 0.8/0.9's core/scheduler.py and worker.py)
_KV_TOO_SMALL = re.compile(
    r"To serve at least one request with the models?'s? max seq len \((?P<len>\d+)\), "
    r"\((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \((?P<have>[\d.]+) GiB\)\.(?: Based on the available memory, the estimated maximum "
    r"model length is (?P<est>\d+)\.)?"
)
_KV_TOO_SMALL_V0 = re.compile(
    r"The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that "
    r"can be stored in KV cache \((?P<est>\d+)\)"
)
_KV_LOAD = re.compile(
    r"(?:Recovered from KV load failure: (?P<ok>\d+) request\(s\) rescheduled"
    r"|Failing (?P<bad>\d+) request\(s\) due to KV load failure)"
)
_HEALTH = re.compile(r'"GET /health HTTP/[\d.]+" (?P<code>5\d\d)')
# The last line of a traceback, after vLLM's optional `(Proc pid=N) LEVEL MM-DD hh:mm:ss [f:n]`
# (releases before about 0.20 colour the process prefix with ANSI codes, in files too)
_ANSI = r"(?:\x1b\[[\d;]*m)?"
_PREFIX = (
    rf"^{_ANSI}(?:\(\w+ pid=\d+\){_ANSI} )?"
    r"(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?"
)
_EXCEPTION = re.compile(
    _PREFIX + r"(?P<type>(?:[A-Za-z_][\w.]*)?(?:Error|Exception))(?:: (?P<msg>.*))?$"
)
_MESSAGES: tuple[tuple[str, What], ...] = (
    # a stop asked for; vLLM 0.32 then logs an EngineDeadError traceback from its output handler
    ("shutdown triggered", What.STOP),
    ("received signal=SIGTERM", What.STOP),
    ("received signal=SIGINT", What.STOP),
    ("Shutdown initiated", What.STOP),  # 0.20's EngineCore
    ("No available memory for the cache blocks", What.NO_CACHE_MEMORY),
    ("CUDA out of memory", What.OUT_OF_MEMORY),
    ("HIP out of memory", What.OUT_OF_MEMORY),
    ("OutOfMemoryError", What.OUT_OF_MEMORY),
    ("Engine core initialization failed", What.STARTUP_FAILURE),
    ("EngineCore failed to start", What.STARTUP_FAILURE),
    ("EngineCore encountered a fatal error", What.ENGINE_DEATH),
    ("EngineDeadError", What.ENGINE_DEATH),
    ("EngineCore encountered an issue", What.ENGINE_DEATH),
    ("engine core exited unexpectedly", What.ENGINE_DEATH),
    ("died unexpectedly", What.ENGINE_DEATH),
)
# Exceptions that a normal stop prints (Ctrl-C, SIGTERM): not a crash
_ORDINARY = ("KeyboardInterrupt", "CancelledError", "SystemExit", "GeneratorExit")
_BARE = ("Error", "Exception")
# Substrings every incident line contains, for the log parser's fast pre-filter
INCIDENT_NEEDLES = (
    "max seq len", "KV load failure", "GET /health", "Error", "Exception", "out of memory",
    "Engine core", "EngineCore", "died unexpectedly", "exited unexpectedly",
    "shutdown triggered", "received signal=", "Shutdown initiated",
)  # fmt: skip
_MAX_DETAIL = 300


def _stamp(line: str) -> str | None:
    m = re.search(r"(?:INFO|WARNING|DEBUG|ERROR|WARN|CRITICAL)\s+(\d\d-\d\d \d\d:\d\d:\d\d)", line)
    return m.group(1) if m else None


def _message(line: str) -> str:
    """The line without vLLM's process and logger prefix."""
    return re.sub(_PREFIX, "", line).strip()[:_MAX_DETAIL]


def incident_line(line: str) -> IncidentLine | None:
    """The incident one line tells of, or None."""
    at = _stamp(line)
    if "max seq len" in line:
        m = _KV_TOO_SMALL.search(line)
        if m:
            est = m["est"]
            return IncidentLine(
                What.KV_CACHE_TOO_SMALL,
                f"max_model_len {m['len']} needs {m['need']} GiB of KV, "
                f"{m['have']} GiB available",
                at, int(m["len"]), None if est is None else int(est),
            )  # fmt: skip
        m = _KV_TOO_SMALL_V0.search(line)
        if m:
            return IncidentLine(
                What.KV_CACHE_TOO_SMALL,
                f"max_model_len {m['len']} is more than the {m['est']} tokens the KV cache holds",
                at, int(m["len"]), int(m["est"]),
            )  # fmt: skip
    if "KV load failure" in line:
        m = _KV_LOAD.search(line)
        if m:
            detail = (
                f"{m['ok']} request(s) rescheduled after a KV load failure"
                if m["ok"]
                else f"{m['bad']} request(s) failed on a KV load failure"
            )
            return IncidentLine(What.KV_LOAD_FAILURE, detail, at)
    if "GET /health" in line:
        m = _HEALTH.search(line)
        if m:
            return IncidentLine(What.HEALTH_CHECK_FAILED, f"/health answered {m['code']}", at)
        return None
    for needle, what in _MESSAGES:
        if needle in line:
            return IncidentLine(what, _message(line), at)
    m = _EXCEPTION.match(line)
    # a bare "Error" or "Exception" is a word, not a traceback's last line
    if m and not m["type"].endswith(_ORDINARY) and (m["msg"] or m["type"] not in _BARE):
        return IncidentLine(What.CRASH, _message(line), at)
    return None


def seconds_of(stamp: str | None) -> float | None:
    """`MM-DD hh:mm:ss` as seconds since the start of a (31-day-month) year: enough to tell
    gaps apart within one log, which never states the year."""
    if stamp is None:
        return None
    try:
        month, day = int(stamp[0:2]), int(stamp[3:5])
        h, m, s = int(stamp[6:8]), int(stamp[9:11]), int(stamp[12:14])
    except ValueError:
        return None
    return ((((month - 1) * 31 + day - 1) * 24 + h) * 60 + m) * 60.0 + s


@dataclass
class Incident:
    """One thing that happened, with the lines that told of it."""

    what: What
    started_at: str | None
    ended_at: str | None
    detail: str
    cause: str | None = None  # the first exception among its lines
    lines: int = 1
    count: int = 0  # preemption episodes: the latest cumulative count; saturation: most waiting
    first_count: int = 0  # preemption episodes: the cumulative count at the first warning
    max_model_len: int | None = None
    suggested_max_model_len: int | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "incident",
            "what": self.what.value,
            "at": self.started_at,
            "until": self.ended_at,
            "detail": self.detail,
            "cause": self.cause,
            "lines": self.lines,
            "count": self.count,
            "first_count": self.first_count,
            "max_model_len": self.max_model_len,
            "suggested_max_model_len": self.suggested_max_model_len,
            "version": self.version,
        }

    def describe(self) -> str:
        text = self.detail
        if self.what is What.KV_CACHE_TOO_SMALL and self.suggested_max_model_len:
            text += f"; vLLM says --max-model-len {self.suggested_max_model_len} would fit"
        if self.cause and self.cause != self.detail:
            text += f" (cause: {self.cause})"
        if self.lines > 1 and self.what not in (What.PREEMPTION_EPISODE, What.SATURATION):
            text += f" [{self.lines} lines]"
        return text


@dataclass
class _Run:
    """An incident still open to more lines, and when its last timed line came."""

    incident: Incident
    gap_s: float
    last: float | None = None

    def takes(self, t: float | None) -> bool:
        return t is None or self.last is None or t - self.last <= self.gap_s

    def over(self, t: float) -> bool:
        return self.last is not None and t - self.last > self.gap_s

    def extend(self, t: float | None, logged_at: str | None) -> None:
        self.incident.lines += 1
        self.incident.ended_at = logged_at or self.incident.ended_at
        if t is not None:
            self.last = t


@dataclass
class IncidentTracker:
    """Folds a log's events, in order, into incidents. Feed it with `line`, `server_start`,
    `preemption_warning`, `stats` and `tick` (any other timed line: it closes what is open
    once the gap has passed); `finish` closes the rest and returns them all."""

    incidents: list[Incident] = field(default_factory=list)
    max_kept: int | None = None  # a long-lived follower keeps the latest this many
    # every incident closed (so named for good; a stop or restart at once), by kind: a
    # counter that never goes back, though a traceback's name changes as its lines come
    counted: Counter[What] = field(default_factory=Counter)
    _lines: _Run | None = None  # incident lines (a traceback and what follows it)
    # runs of V0 preemption warnings, and of stats lines with the cache full and requests
    # waiting, by their kind
    _runs: dict[What, _Run] = field(default_factory=dict)
    _started: bool = False
    _stopping: Incident | None = None  # a stop was asked for since the server last started
    # the engine's end since the server last started (None: none logged since)
    fatal: Incident | None = None

    def line(self, ev: IncidentLine) -> None:
        t = seconds_of(ev.logged_at)
        stop = self._stopping
        if stop is not None and ev.what not in _REAL_WHILE_STOPPING:
            # the engine going away after a stop was asked for: part of the stop
            stop.lines += 1
            stop.ended_at = ev.logged_at or stop.ended_at
            return
        if ev.what is What.STOP:
            self._close_lines()
            self._stopping = Incident(What.STOP, ev.logged_at, ev.logged_at, ev.detail)
            self._keep(self._stopping)
            return
        run = self._lines
        if run is None or not run.takes(t):
            self._close_lines()
            inc = Incident(
                ev.what, ev.logged_at, ev.logged_at, ev.detail,
                cause=ev.detail if ev.what is What.CRASH else None,
                max_model_len=ev.max_model_len,
                suggested_max_model_len=ev.suggested_max_model_len,
            )  # fmt: skip
            self._lines = _Run(inc, GROUP_GAP_S, t)
            if ev.what.fatal:
                self.fatal = inc
            return
        run.extend(t, ev.logged_at)
        cur = run.incident
        if ev.what is What.CRASH and cur.cause is None:
            cur.cause = ev.detail
        if ev.what.rank < cur.what.rank:
            if ev.what.fatal:
                self.fatal = cur
            cur.what, cur.detail = ev.what, ev.detail
            cur.max_model_len = ev.max_model_len or cur.max_model_len
            cur.suggested_max_model_len = ev.suggested_max_model_len or cur.suggested_max_model_len

    def server_start(self, version: str | None, logged_at: str | None) -> None:
        """A startup banner: a restart when the log had one before."""
        if version is None:
            return
        self._close_all()
        self.fatal, self._stopping = None, None
        if self._started:
            self._keep(
                Incident(
                    What.RESTART,
                    logged_at,
                    logged_at,
                    f"vLLM {version} started again",
                    version=version,
                )  # fmt: skip
            )
        self._started = True

    def preemption_warning(self, logged_at: str | None, cumulative: int) -> None:
        self._tally(What.PREEMPTION_EPISODE, logged_at, cumulative)

    def stats(self, logged_at: str | None, kv_usage: float, waiting: int) -> None:
        """A periodic stats line: a run of them with the cache full and requests waiting is
        one saturation incident."""
        self.tick(logged_at)
        if kv_usage >= SATURATED_KV and waiting >= 1:
            self._tally(What.SATURATION, logged_at, waiting)

    def _tally(self, what: What, logged_at: str | None, count: int) -> None:
        """One more line of a run of `what`, or the first of a new one; `count` is the
        largest seen."""
        t = seconds_of(logged_at)
        run = self._runs.get(what)
        if run is None or not run.takes(t):
            self._close_run(what)
            inc = Incident(what, logged_at, logged_at, "", count=count, first_count=count)
            self._runs[what] = _Run(inc, EPISODE_GAP_S, t)
            return
        run.extend(t, logged_at)
        run.incident.count = max(run.incident.count, count)

    def tick(self, logged_at: str | None) -> None:
        t = seconds_of(logged_at)
        if t is None:
            return
        if self._lines is not None and self._lines.over(t):
            self._close_lines()
        for what, run in list(self._runs.items()):
            if run.over(t):
                self._close_run(what)

    def finish(self) -> list[Incident]:
        """Every incident, in the order they began (an episode closes after what came in it)."""
        self._close_all()
        self.incidents = _in_order(self.incidents)
        return self.incidents

    def snapshot(self) -> list[Incident]:
        """What a follower shows now: those closed and those still open, as copies."""
        now = [replace(x) for x in self.incidents]
        if self._lines is not None:
            now.append(replace(self._lines.incident))
        now += [replace(r.incident, detail=_run_detail(r.incident)) for r in self._runs.values()]
        return _in_order(now)

    def _keep(self, incident: Incident) -> None:
        self.counted[incident.what] += 1
        self.incidents.append(incident)
        if self.max_kept is not None and len(self.incidents) > self.max_kept:
            del self.incidents[: len(self.incidents) - self.max_kept]

    def _close_all(self) -> None:
        self._close_lines()
        for what in list(self._runs):
            self._close_run(what)

    def _close_lines(self) -> None:
        if self._lines is not None:
            self._keep(self._lines.incident)
            self._lines = None

    def _close_run(self, what: What) -> None:
        run = self._runs.pop(what, None)
        if run is not None:
            run.incident.detail = _run_detail(run.incident)
            self._keep(run.incident)


def _run_detail(x: Incident) -> str:
    """What a run of preemption warnings or of full-cache stats lines says, so far."""
    if x.what is What.PREEMPTION_EPISODE:
        return (
            f"{x.lines} V0 preemption warnings, cumulative count {x.first_count} to {x.count} "
            "(V0 warns on the 1st, 51st, 101st... preemption)"
        )
    return (
        f"KV cache at {SATURATED_KV:.0%} or more with up to {x.count} requests waiting, "
        f"{x.lines} stats lines (V1 logs no preemptions: /metrics counts them)"
    )


def _in_order(incidents: list[Incident]) -> list[Incident]:
    """By start time, those without one last, ties as they came."""
    return sorted(incidents, key=lambda x: seconds_of(x.started_at) or float("inf"))
