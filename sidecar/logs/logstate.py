"""What a target's log said: its capacity line, the latest stats line per engine, preemption
warnings and repeat victims, and its incidents (sidecar/logs/incidents.py). Fed line by line;
bounded."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields, replace

from kvwatch.sidecar.logs.incidents import IncidentTracker
from kvwatch.sidecar.logs.logformats import (
    Capacity,
    IncidentLine,
    LogEvent,
    PreemptionWarning,
    ServerStart,
    StatsLine,
)
from kvwatch.sidecar.metrics.observe import CacheConfig
from kvwatch.sizing.levers import ServerInfo

__all__ = ["LogState", "track_incidents"]

_MAX_WARNED_IDS = 10_000
_MAX_INCIDENTS = 100  # the latest kept; the counts by kind are kept whole


@dataclass
class LogState:
    capacity: Capacity | None = None
    stats: dict[str, StatsLine] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)
    warnings: int = 0
    max_cumulative: int = 0
    warned_ids: OrderedDict[str, int] = field(default_factory=OrderedDict)
    version: str | None = None  # the latest startup banner's
    server_args: tuple[tuple[str, str], ...] = ()  # the latest `non-default args`
    incidents: IncidentTracker = field(
        default_factory=lambda: IncidentTracker(max_kept=_MAX_INCIDENTS)
    )

    def take(self, ev: LogEvent) -> None:
        self.events[ev.kind] += 1
        track_incidents(self.incidents, ev)
        if isinstance(ev, StatsLine):
            self.stats[ev.engine or ""] = ev
        elif isinstance(ev, Capacity):
            if self.capacity is None:
                self.capacity = ev
            else:  # two-line eras: merge the fields each line carries
                self.capacity = _merge(self.capacity, ev)
        elif isinstance(ev, ServerStart):
            if ev.version is not None:
                self.version = ev.version
            if ev.args is not None:
                self.server_args = ev.args
        elif isinstance(ev, PreemptionWarning):
            self.warnings += 1
            self.max_cumulative = max(self.max_cumulative, ev.cumulative)
            self.warned_ids[ev.request_id] = self.warned_ids.pop(ev.request_id, 0) + 1
            if len(self.warned_ids) > _MAX_WARNED_IDS:
                self.warned_ids.popitem(last=False)

    def scheduling_policy(self) -> str | None:
        """The server's --scheduling-policy, where its launch line gave one."""
        return ServerInfo(args=self.server_args).scheduling_policy

    @property
    def repeat_warned_ids(self) -> int:
        return sum(1 for n in self.warned_ids.values() if n > 1)

    def cache_fallback(self) -> CacheConfig | None:
        c = self.capacity
        if c is None:
            return None
        return CacheConfig(num_blocks=c.gpu_blocks, kv_tokens=c.kv_tokens)


def track_incidents(t: IncidentTracker, ev: LogEvent) -> None:
    """One event, in log order, into the incident tracker (the sidecar's and `kvwatch logs`')."""
    if isinstance(ev, IncidentLine):
        t.line(ev)
    elif isinstance(ev, ServerStart):
        t.server_start(ev.version, ev.logged_at)
    elif isinstance(ev, PreemptionWarning):
        t.preemption_warning(ev.logged_at, ev.cumulative)
    elif isinstance(ev, StatsLine):
        t.stats(ev.logged_at, ev.kv_usage, ev.waiting)
    else:
        t.tick(ev.logged_at)


def _merge(old: Capacity, new: Capacity) -> Capacity:
    given = {f.name: v for f in fields(new) if (v := getattr(new, f.name)) is not None}
    return replace(old, **given)
