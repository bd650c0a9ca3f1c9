"""Everything the sidecar knows, behind one lock: targets, their engines' timelines, the log.

Writers are the scrape loop and the log reader; readers are the HTTP endpoint. Readers get a
`snapshot()`, a plain dict built under the lock, so nothing outside sees a half-updated state.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvwatch.sidecar.detect import Detector, Level, gather_evidence, judge
from kvwatch.sidecar.episodes import Episode, EpisodeStore, EpisodeTracker
from kvwatch.sidecar.exposition import Exposition
from kvwatch.sidecar.follow import FollowStats
from kvwatch.sidecar.logformats import (
    Capacity,
    LogEvent,
    PreemptionWarning,
    StatsLine,
    event_to_dict,
    parse_line,
)
from kvwatch.sidecar.observe import CacheConfig, EngineKey, observe
from kvwatch.sidecar.signals import derive
from kvwatch.sidecar.thresholds import Thresholds
from kvwatch.sidecar.timeline import Timeline

__all__ = ["TargetState", "LogState", "SidecarState", "ScrapeOutcome"]

_MAX_WARNED_IDS = 10_000
_MAX_TRANSITIONS = 500


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
class EngineState:
    """One engine's history and judgement."""

    timeline: Timeline
    detector: Detector
    episodes: EpisodeTracker
    episode_count: int = 0


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
    engines: dict[EngineKey, EngineState] = field(default_factory=dict)
    present: set[EngineKey] = field(default_factory=set)
    log: LogState = field(default_factory=LogState)


class SidecarState:
    def __init__(
        self,
        targets: list[str],
        thresholds: Thresholds | None = None,
        store: EpisodeStore | None = None,
    ) -> None:
        if not targets:
            raise ValueError("at least one target is needed")
        self.th = thresholds or Thresholds()
        self.store = store or EpisodeStore(None)
        self.store.close_dangling(time.time())
        self._episode_counts = self.store.counts()
        self.transitions: deque[dict[str, Any]] = deque(maxlen=_MAX_TRANSITIONS)
        self.targets = {url: TargetState(url) for url in targets}
        self.alerting: dict[str, Any] = {"firing": [], "webhooks": {}}
        self.load_events: deque[dict[str, Any]] = deque(maxlen=_MAX_TRANSITIONS)
        self.load_stages: dict[str, float] = {}  # stages running now -> since (unix)
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
                es = ts.engines.get(key)
                if es is None:
                    es = ts.engines[key] = EngineState(
                        Timeline(),
                        Detector(self.th),
                        EpisodeTracker(url, *key),
                        self._episode_counts.get((url, *key), 0),
                    )
                self._judge(ts, key, es, now, obs)

    def _judge(
        self, ts: TargetState, key: EngineKey, es: EngineState, now: float, obs: Any
    ) -> None:
        tl = es.timeline
        before = dict(tl.observed)
        tl.add(now, obs)
        sig = derive(tl, now, self.th, ts.log.cache_fallback())
        if sig is None:
            return
        ev = gather_evidence(tl, sig, now, self.th)
        raw, reasons = judge(ev, self.th, es.detector.level)
        old = es.detector.level
        if es.detector.update(now, raw, reasons):
            self.transitions.append(
                {
                    "unix": time.time(),
                    "target": ts.url,
                    "model_name": key[0],
                    "engine": key[1],
                    "from": old.label,
                    "to": es.detector.level.label,
                    "reasons": es.detector.reasons,
                }
            )
        thrashing = es.detector.level is Level.THRASHING
        opened = es.episodes.current is None
        ep = es.episodes.tick(
            time.time(),
            thrashing,
            sig,
            tl.observed["preemptions_total"] - before["preemptions_total"],
            tl.observed["repeat_preempted_total"] - before["repeat_preempted_total"],
        )
        if ep is not None:
            if opened:
                es.episode_count += 1
            self.store.save(ep)

    def record_log_lines(self, lines: list[str]) -> None:
        events = [ev for ev in map(parse_line, lines) if ev is not None]
        if not events:
            return
        with self._lock:
            log = self.targets[self.log_target].log
            for ev in events:
                log.take(ev)

    def record_load_event(self, event: dict[str, Any]) -> None:
        """A load generator's stage start or end (`kvwatch loadgen run --sidecar URL`)."""
        kind, stage = event.get("event"), event.get("stage")
        if kind not in ("stage_start", "stage_end") or not isinstance(stage, str) or not stage:
            raise ValueError('expected {"event": "stage_start"|"stage_end", "stage": NAME}')
        unix = event.get("unix")
        when = float(unix) if isinstance(unix, int | float) else time.time()
        with self._lock:
            self.load_events.append({"event": kind, "stage": stage[:200], "unix": when})
            if kind == "stage_start":
                self.load_stages[stage[:200]] = when
            else:
                self.load_stages.pop(stage[:200], None)

    def set_alerting(self, status: dict[str, Any]) -> None:
        with self._lock:
            self.alerting = status

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """A JSON-ready picture of everything; the exporter and the state API both read this."""
        now = time.monotonic() if now is None else now
        with self._lock:
            targets = []
            for ts in self.targets.values():
                fallback = ts.log.cache_fallback()
                engines = []
                for (model, engine), es in ts.engines.items():
                    sig = derive(es.timeline, now, self.th, fallback)
                    if sig is None:
                        continue
                    det = es.detector
                    cur = es.episodes.current
                    engines.append(
                        {
                            "model_name": model,
                            "engine": engine,
                            "present": (model, engine) in ts.present,
                            "state": det.level.label,
                            "state_level": int(det.level),
                            "state_reasons": list(det.reasons),
                            "episodes": es.episode_count,
                            "episode": None if cur is None else cur.to_dict(),
                            "signals": sig.to_dict(),
                        }
                    )
                log = ts.log
                targets.append(
                    {
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
                            "capacity": None
                            if log.capacity is None
                            else event_to_dict(log.capacity),
                            "events": dict(log.events),
                            "preemption_warnings": log.warnings,
                            "max_cumulative_preemptions": log.max_cumulative,
                            "repeat_warned_requests": log.repeat_warned_ids,
                            "stats": {k: event_to_dict(v) for k, v in log.stats.items()},
                        },
                    }
                )
            ls = self.log_stats
            return {
                "started_unix": self.started_wall,
                "heartbeat_age_s": now - self.heartbeat,
                "thresholds": asdict(self.th),
                "transitions": list(self.transitions)[-50:],
                "alerting": self.alerting,
                "load": {"stages": dict(self.load_stages), "events": list(self.load_events)[-50:]},
                "log": None if ls is None else {"source": self.log_source, **ls.__dict__},
                "targets": targets,
            }

    def episodes(self, limit: int = 50) -> list[Episode]:
        return self.store.recent(limit)
