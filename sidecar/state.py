"""Everything the sidecar knows, behind one lock: targets, their engines' timelines, the log.

Writers are the scrape loop and the log reader; readers are the HTTP endpoint. Readers get a
`snapshot()`, a plain dict built under the lock, so nothing outside sees a half-updated state.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.exposition import Exposition
from sidecar.follow import FollowStats
from sidecar.logformats import (
    Capacity,
    LogEvent,
    PreemptionWarning,
    StatsLine,
    event_to_dict,
    parse_line,
)  # fmt: skip
from sidecar.observe import CacheConfig, EngineKey, observe
from sidecar.signals import Windows, derive
from sidecar.timeline import Timeline

__all__ = ["TargetState", "LogState", "SidecarState", "ScrapeOutcome"]

_MAX_WARNED_IDS = 10_000


@dataclass(frozen=True)
class ScrapeOutcome:
    """One scrape: an exposition, or why it failed (timeout, connect, http_5xx...)."""

    duration_s: float
    exposition: Exposition | None = None
    error_reason: str | None = None
    error: str | None = None


@dataclass
class LogState:
    """What the log said, for the target it belongs to."""

    capacity: Capacity | None = None
    stats: dict[str, StatsLine] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)
    warnings: int = 0
    max_cumulative: int = 0
    warned_ids: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def take(self, ev: LogEvent) -> None:
        self.events[ev.kind] += 1
        if isinstance(ev, StatsLine):
            self.stats[ev.engine or ""] = ev
        elif isinstance(ev, Capacity):
            if self.capacity is None:
                self.capacity = ev
            else:  # two-line eras: merge the fields each line carries
                given = {k: v for k, v in event_to_dict(ev).items() if v is not None}
                self.capacity = replace(self.capacity, **given)
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


@dataclass
class TargetState:
    url: str
    up: bool | None = None  # None until the first scrape ends
    scrapes: int = 0
    scrape_errors: Counter[str] = field(default_factory=Counter)
    parse_errors: int = 0
    last_error: str | None = None
    last_duration_s: float | None = None
    last_success_wall: float | None = None
    vllm_metrics_present: bool | None = None
    engines: dict[EngineKey, Timeline] = field(default_factory=dict)
    present: set[EngineKey] = field(default_factory=set)
    log: LogState = field(default_factory=LogState)


class SidecarState:
    def __init__(self, targets: list[str], windows: Windows | None = None) -> None:
        if not targets:
            raise ValueError("at least one target is needed")
        self.windows = windows or Windows()
        self.targets = {url: TargetState(url) for url in targets}
        self.log_target = targets[0]
        self.log_stats: FollowStats | None = None
        self.log_source: str | None = None
        self.started_wall = time.time()
        self.heartbeat = time.monotonic()
        self._lock = threading.Lock()

    def record_scrape(self, url: str, now: float, outcome: ScrapeOutcome) -> None:
        with self._lock:
            self.heartbeat = now
            ts = self.targets[url]
            ts.scrapes += 1
            ts.last_duration_s = outcome.duration_s
            exp = outcome.exposition
            if exp is None:
                ts.up = False
                ts.scrape_errors[outcome.error_reason or "unknown"] += 1
                ts.last_error = outcome.error
                ts.present = set()
                return
            ts.up = True
            ts.last_error = None
            ts.last_success_wall = time.time()
            ts.parse_errors += exp.error_count
            observed = observe(exp)
            ts.vllm_metrics_present = bool(observed)
            ts.present = set(observed)
            for key, obs in observed.items():
                tl = ts.engines.get(key)
                if tl is None:
                    tl = ts.engines[key] = Timeline()
                tl.add(now, obs)

    def record_log_lines(self, lines: list[str]) -> None:
        events = [ev for ev in map(parse_line, lines) if ev is not None]
        if not events:
            return
        with self._lock:
            log = self.targets[self.log_target].log
            for ev in events:
                log.take(ev)

    def beat(self, now: float) -> None:
        with self._lock:
            self.heartbeat = now

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """A JSON-ready picture of everything; the exporter and the state API both read this."""
        now = time.monotonic() if now is None else now
        with self._lock:
            targets = []
            for ts in self.targets.values():
                fallback = ts.log.cache_fallback()
                engines = []
                for (model, engine), tl in ts.engines.items():
                    sig = derive(tl, now, self.windows, fallback)
                    if sig is None:
                        continue
                    engines.append({
                        "model_name": model,
                        "engine": engine,
                        "present": (model, engine) in ts.present,
                        "signals": sig.to_dict(),
                    })  # fmt: skip
                log = ts.log
                targets.append({
                    "target": ts.url,
                    "up": ts.up,
                    "scrapes": ts.scrapes,
                    "scrape_errors": dict(ts.scrape_errors),
                    "parse_errors": ts.parse_errors,
                    "last_error": ts.last_error,
                    "last_scrape_duration_s": ts.last_duration_s,
                    "last_success_unix": ts.last_success_wall,
                    "vllm_metrics_present": ts.vllm_metrics_present,
                    "engines": engines,
                    "log": {
                        "capacity": None if log.capacity is None else event_to_dict(log.capacity),
                        "events": dict(log.events),
                        "preemption_warnings": log.warnings,
                        "max_cumulative_preemptions": log.max_cumulative,
                        "repeat_warned_requests": log.repeat_warned_ids,
                        "stats": {k: event_to_dict(v) for k, v in log.stats.items()},
                    },
                })  # fmt: skip
            ls = self.log_stats
            return {
                "started_unix": self.started_wall,
                "heartbeat_age_s": now - self.heartbeat,
                "windows": {"short_s": self.windows.short_s, "long_s": self.windows.long_s},
                "log": None if ls is None else {"source": self.log_source, **ls.__dict__},
                "targets": targets,
            }
