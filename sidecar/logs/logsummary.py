"""`kvwatch logs`: what a vLLM log says happened, for "what happened last night?".

Pure: events in, a summary dict out; rendering is separate from computing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvwatch.sidecar.logs.incidents import Incident, IncidentTracker
from kvwatch.sidecar.logs.logformats import (
    Capacity,
    IterationLine,
    LogEvent,
    Malformed,
    PreemptionWarning,
    ServerStart,
    StatsLine,
    event_to_dict,
)
from kvwatch.sidecar.logs.logstate import track_incidents

__all__ = ["LogSummary", "summarize", "render_summary"]

HIGH_KV = 0.90  # KV usage counted as "high" in the per-minute table
V0_WARNING_EVERY = 50  # V0 logs only the 1st, 51st, 101st... preemption


@dataclass
class _Minute:
    samples: int = 0
    kv_sum: float = 0.0
    kv_max: float = 0.0
    high: int = 0
    running_max: int = 0
    waiting_max: int = 0
    gen_tps_sum: float = 0.0


@dataclass
class LogSummary:
    lines: int = 0
    capacity: dict[str, Any] | None = None
    stats_lines: int = 0
    eras: set[str] = field(default_factory=set)
    warnings: int = 0
    max_cumulative: int = 0
    warned: dict[str, int] = field(default_factory=dict)
    interval_preemptions: int = 0
    malformed: int = 0  # lines of a known shape with broken or impossible numbers, skipped
    iteration_lines: int = 0  # 0.33's per-step lines
    iteration_kv_max: float = 0.0
    version: str | None = None  # the latest startup banner's
    server_args: dict[str, str] = field(default_factory=dict)  # secrets hidden
    # (minute, engine): engines are kept apart (two engines at 100 tok/s are not one at 100)
    minutes: dict[tuple[str, str], _Minute] = field(default_factory=dict)
    incidents: list[Incident] = field(default_factory=list)  # in the order they began
    recognised: int = 0  # lines that were one of the events above

    @property
    def went_wrong(self) -> bool:
        return any(i.what.wrong for i in self.incidents)

    def to_dict(self) -> dict[str, Any]:
        repeat = {k: v for k, v in self.warned.items() if v > 1}
        return {
            "lines": self.lines,
            "recognised_lines": self.recognised,
            "went_wrong": self.went_wrong,
            "incidents": [i.to_dict() for i in self.incidents],
            "vllm_version": self.version,
            "iteration_lines": self.iteration_lines,
            "iteration_kv_max": self.iteration_kv_max,
            "server_args": self.server_args,
            "capacity": self.capacity,
            "stats_lines": self.stats_lines,
            "eras": sorted(self.eras),
            "preemption_warnings": self.warnings,
            "cumulative_preemptions": self.max_cumulative,
            "stats_line_preemptions": self.interval_preemptions,
            "malformed_lines": self.malformed,
            "requests_warned_repeatedly": repeat,
            "minutes": [
                {
                    "minute": k,
                    "engine": engine,
                    "kv_usage_mean": round(m.kv_sum / m.samples, 4),
                    "kv_usage_max": m.kv_max,
                    "high_kv_fraction": round(m.high / m.samples, 3),
                    "running_max": m.running_max,
                    "waiting_max": m.waiting_max,
                    "generation_tps_mean": round(m.gen_tps_sum / m.samples, 1),
                }
                for (k, engine), m in self.minutes.items()
            ],
        }


def summarize(events: Iterable[LogEvent], lines: int = 0) -> LogSummary:
    s = LogSummary(lines=lines)
    track = IncidentTracker()
    for ev in events:
        s.recognised += 1
        track_incidents(track, ev)
        if isinstance(ev, Capacity):
            given = {k: v for k, v in event_to_dict(ev).items() if v is not None and k != "kind"}
            s.capacity = {**(s.capacity or {}), **given}
        elif isinstance(ev, Malformed):
            s.malformed += 1
        elif isinstance(ev, IterationLine):
            s.iteration_lines += 1
            s.iteration_kv_max = max(s.iteration_kv_max, ev.kv_usage)
        elif isinstance(ev, ServerStart):
            s.version = ev.version or s.version
            if ev.args is not None:
                s.server_args = dict(ev.args)
        elif isinstance(ev, PreemptionWarning):
            s.warnings += 1
            s.max_cumulative = max(s.max_cumulative, ev.cumulative)
            s.warned[ev.request_id] = s.warned.get(ev.request_id, 0) + 1
        elif isinstance(ev, StatsLine):
            s.stats_lines += 1
            s.eras.add(ev.era)
            s.interval_preemptions += ev.preemptions or 0
            key = ev.logged_at[:11] if ev.logged_at else "?"
            m = s.minutes.setdefault((key, ev.engine or "-"), _Minute())
            m.samples += 1
            m.kv_sum += ev.kv_usage
            m.kv_max = max(m.kv_max, ev.kv_usage)
            m.high += ev.kv_usage >= HIGH_KV
            m.running_max = max(m.running_max, ev.running)
            m.waiting_max = max(m.waiting_max, ev.waiting)
            m.gen_tps_sum += ev.generation_tps
    s.incidents = track.finish()
    return s


def _timeline(s: LogSummary) -> list[str]:
    wrong = sum(1 for i in s.incidents if i.what.wrong)
    verdict = f"{wrong} incident(s) that went wrong" if wrong else "no incident went wrong"
    if not s.incidents:
        return [f"timeline: {verdict} (no engine death, failed start, out of memory, KV load "
                "failure, failed health check, preemption episode, saturation, stop or restart "
                "logged)"]  # fmt: skip
    n = len(s.incidents)
    out = [f"timeline: {verdict}; {n} {'entry' if n == 1 else 'entries'}"]
    for i in s.incidents:
        when = i.started_at or "(no time)"
        if i.ended_at and i.ended_at != i.started_at:
            when += f" to {i.ended_at[6:]}"
        out.append(f"  {when:<24}  {i.what.value:<20}  {i.describe()}")
    return out


def _recognition(s: LogSummary) -> list[str]:
    """How much of the log kvwatch read, and a warning when none of it was vLLM's known lines
    (a release whose formats kvwatch does not know, or not a vLLM log)."""
    unread = s.lines - s.recognised
    line = f"recognised: {s.recognised:,} of {s.lines:,} lines ({unread:,} others: access log, "
    line += "messages kvwatch does not read)"
    out = [line]
    known = s.stats_lines or s.capacity or s.version or s.warnings or s.iteration_lines
    if s.lines and not known:
        out.append(
            "warning: no stats, capacity, version or preemption line recognised: a vLLM "
            "release whose log format kvwatch does not know, or not a vLLM log; read on a "
            "best-effort basis"
        )
    return out


def render_summary(s: LogSummary) -> str:
    out = [f"lines read: {s.lines:,}", *_recognition(s), *_timeline(s)]
    if s.malformed:
        out.append(f"skipped: {s.malformed:,} lines with broken or impossible numbers")
    if s.iteration_lines:
        out.append(
            f"iteration lines (0.33 step details): {s.iteration_lines:,}, KV usage at most "
            f"{s.iteration_kv_max:.0%}"
        )
    if s.version or s.server_args:
        given = ", ".join(f"{k}={v}" for k, v in s.server_args.items())
        out.append(
            f"server: vLLM {s.version or '(version not logged)'}"
            + (f"; non-default args: {given}" if given else "")
        )
    if s.capacity:
        cap = s.capacity
        parts = []
        if "kv_tokens" in cap:
            parts.append(f"{cap['kv_tokens']:,} tokens of KV ({cap.get('device', '?')})")
        if "max_concurrency" in cap:
            parts.append(
                f"{cap['max_concurrency']}x concurrency at {cap.get('max_model_len', '?')} tokens"
            )
        if "gpu_blocks" in cap:
            parts.append(f"{cap['gpu_blocks']:,} {cap.get('device', 'GPU')} blocks")
        out.append("capacity: " + ", ".join(parts))
    else:
        out.append("capacity: no startup capacity line in this log")
    if s.warnings:
        repeat = sum(1 for v in s.warned.values() if v > 1)
        out.append(
            f"preemptions (V0 warnings): {s.warnings} warnings, cumulative count "
            f"{s.max_cumulative} (V0 logs every {V0_WARNING_EVERY}th); "
            f"{repeat} request(s) warned more than once"
        )
    elif s.interval_preemptions:
        out.append(f"preemptions (stats lines): {s.interval_preemptions}")
    else:
        out.append(
            "preemptions: none logged (V1 logs no per-preemption line; scrape /metrics "
            "with `kvwatch sidecar` to count them)"
        )
    if s.minutes:
        out.append(
            f"KV usage over time ({s.stats_lines} stats lines, {', '.join(sorted(s.eras))}):"
        )
        out.append("  minute        engine  mean   max   >=90%  running  waiting  gen tok/s")
        for row in s.to_dict()["minutes"]:
            out.append(
                f"  {row['minute']:<12}  {row['engine']:<6}  {row['kv_usage_mean']:>4.0%}  "
                f"{row['kv_usage_max']:>4.0%}"
                f"  {row['high_kv_fraction']:>5.0%}  {row['running_max']:>7}  "
                f"{row['waiting_max']:>7}  {row['generation_tps_mean']:>9.1f}"
            )
    else:
        out.append("KV usage: no stats lines (vLLM prints them at INFO while busy)")
    return "\n".join(out)
