"""What a target's log said: its capacity line, the latest stats line per engine, preemption
warnings and repeat victims. Fed line by line; bounded."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields, replace

from kvwatch.sidecar.logformats import (
    Capacity,
    LogEvent,
    PreemptionWarning,
    ServerStart,
    StatsLine,
)
from kvwatch.sidecar.observe import CacheConfig

__all__ = ["LogState"]

_MAX_WARNED_IDS = 10_000


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

    def take(self, ev: LogEvent) -> None:
        self.events[ev.kind] += 1
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

    @property
    def repeat_warned_ids(self) -> int:
        return sum(1 for n in self.warned_ids.values() if n > 1)

    def cache_fallback(self) -> CacheConfig | None:
        c = self.capacity
        if c is None:
            return None
        return CacheConfig(num_blocks=c.gpu_blocks, kv_tokens=c.kv_tokens)


def _merge(old: Capacity, new: Capacity) -> Capacity:
    given = {f.name: v for f in fields(new) if (v := getattr(new, f.name)) is not None}
    return replace(old, **given)
