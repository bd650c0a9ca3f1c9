"""Everything the sidecar knows, behind one lock: targets, their engines' judges, the log.

Writers are the scrape loops, the log reader, the alert loop and `POST /api/events`; readers get a
`view()`, frozen typed values built under the lock. The judging itself is sidecar/judge/pipeline.py,
episodes persist through the injected `EpisodeStore`, and the wall clock is injected too, so tests
can drive all of it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from kvwatch.sidecar.contract.readings import FIELDS as READING_FIELDS
from kvwatch.sidecar.contract.readings import FORMAT as READINGS_FORMAT
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.episodes import Episode
from kvwatch.sidecar.judge.fleet_prefix import FleetPrefixView, fleet_prefix_view
from kvwatch.sidecar.judge.fleet_prefix import Replica as FleetReplica
from kvwatch.sidecar.judge.liveness import Liveness, Status, judge_liveness
from kvwatch.sidecar.judge.pipeline import EngineJudge, Transition
from kvwatch.sidecar.judge.prefix_curve import PrefixCurve
from kvwatch.sidecar.judge.reuse_curve import MAX_KEYS, ReuseCurve
from kvwatch.sidecar.kvevents.sequence import FeedStats
from kvwatch.sidecar.kvevents.wire import Batch
from kvwatch.sidecar.logs.follow import FollowStats
from kvwatch.sidecar.logs.logformats import parse_line
from kvwatch.sidecar.logs.logstate import LogState
from kvwatch.sidecar.metrics.observe import EngineKey, observe
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.state.supervise import Supervisor
from kvwatch.sidecar.state.views import (
    AlertingView,
    EngineView,
    LoadEvent,
    LogSourceView,
    LogView,
    StateView,
    TargetView,
)
from kvwatch.sidecar.store.episode_store import EpisodeStore
from kvwatch.sizing.archconfig import Architecture

_log = logging.getLogger("kvwatch.sidecar")

__all__ = ["TargetState", "SidecarState"]

_MAX_TRANSITIONS = 500
_SHOWN = 50  # transitions and load events a view carries
_MAX_OPEN_STAGES = 100
# how long the fleet's prefix figures are reused: their set union walks every replica's cached
# blocks (up to 2^19 each), too much for every view (the judge loop takes one a second)
FLEET_PREFIX_REFRESH_S = 5.0


@dataclass
class TargetState:
    url: str
    up: bool | None = None  # None until the first scrape ends
    scrapes: int = 0
    scrape_errors: Counter[str] = field(default_factory=Counter)
    parse_errors: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # samples refused, by reason
    last_error: str | None = None
    last_duration_s: float | None = None
    last_scrape_at: float | None = None  # monotonic, when the last scrape (of any outcome) ended
    last_success_unix: float | None = None
    vllm_metrics_present: bool | None = None
    metrics_missing_since_unix: float | None = None
    engines: dict[EngineKey, EngineJudge] = field(default_factory=dict)
    present: set[EngineKey] = field(default_factory=set)
    log: LogState = field(default_factory=LogState)
    api_version: str | None = None  # from GET /version
    version_asked_at: float | None = None  # monotonic
    health_failing_since_unix: float | None = None  # /health failing while /metrics answers
    health_detail: str = ""
    fatal_seen_unix: float | None = None  # when the log's latest fatal incident was read
    liveness: Liveness | None = None
    # a kvwatch twin's time scale K (None: a real server): its engines are judged on the
    # twin's simulated clock, which runs 1/K as fast as the wall's (`clock`)
    time_scale: float | None = None
    clock_anchor: tuple[float, float] | None = None  # (wall, simulated) where K last changed
    # the server's KV events, where followed (--kv-events): the curve and the feed's counts
    prefix_curve: PrefixCurve | None = None
    kv_feed: FeedStats | None = None

    def clock(self, now: float) -> float:
        """The judges' clock at monotonic `now`: wall time, or a twin's simulated time. It is
        continuous where K changes, so no window, rate or forecast sees time jump."""
        if self.clock_anchor is None:
            return now
        wall, sim = self.clock_anchor
        return sim + (now - wall) / (self.time_scale or 1.0)

    def take_time_scale(self, k: float | None, now: float) -> bool:
        """Adopt the scale the target declares; True when it changed."""
        if k == self.time_scale:
            return False
        self.clock_anchor = (now, self.clock(now))
        self.time_scale = k
        return True

    def judge_liveness(self, now: float, unix: float, th: Thresholds) -> None:
        """The engine's liveness from what was last seen (scrape, /health, log)."""
        fatal = self.log.incidents.fatal
        if fatal is None:
            self.fatal_seen_unix = None
        elif self.fatal_seen_unix is None:
            self.fatal_seen_unix = unix
        at = self.clock(now)
        stalled = max(
            (ej.timeline.stalled_s(at) for k, ej in self.engines.items() if k in self.present),
            default=0.0,
        )
        self.liveness = judge_liveness(
            self.up, self.health_failing_since_unix, self.health_detail, fatal,
            self.fatal_seen_unix, stalled, unix, th,
        )  # fmt: skip

    def wants_version(self, now: float, retry_s: float = 60.0) -> bool:
        """Ask `/version` when the target is up and the answer is unknown (again after a
        failed scrape: a restart may bring another release), at most once a `retry_s`."""
        if not self.up or self.api_version is not None:
            return False
        return self.version_asked_at is None or now - self.version_asked_at >= retry_s

    def view(self, now: float, stale_after_s: float) -> TargetView:
        """As of monotonic `now`: a target whose last scrape ended over `stale_after_s` ago is
        down (its scrape loop is stuck or failing), never shown up with old figures."""
        up, error = self.up, self.last_error
        age = None if self.last_scrape_at is None else now - self.last_scrape_at
        if up and age is not None and age > stale_after_s:
            up, error = False, f"no scrape has ended for {age:.0f} s"
        engines = tuple(
            EngineView(
                model_name=key[0],
                engine=key[1],
                present=bool(up) and key in self.present,
                level=ej.level,
                reasons=tuple(ej.detector.reasons),
                episodes=ej.episode_count,
                episode=None if ej.episodes.current is None else replace(ej.episodes.current),
                signals=ej.signals,
                model_error=ej.model_error,
                exhaustion_imminent_since_unix=ej.exhaustion_imminent_since,
                prefix_cache_thrashing_since_unix=ej.prefix_thrashing_since,
                prefix_cache_reasons=ej.prefix_reasons,
                stalls=dict(ej.stalls.counts) if ej.stalls.seen else {},
            )
            for key, ej in self.engines.items()
            if ej.signals is not None
        )
        log = self.log
        capacity = max((e.signals.capacity_blocks or 0 for e in engines), default=0) or None
        return TargetView(
            target=self.url,
            up=up,
            scrapes=self.scrapes,
            scrape_errors=dict(self.scrape_errors),
            parse_errors=self.parse_errors,
            rejected_samples=dict(self.rejected),
            last_error=error,
            last_scrape_duration_s=self.last_duration_s,
            last_success_unix=self.last_success_unix,
            vllm_metrics_present=self.vllm_metrics_present,
            metrics_missing_since_unix=self.metrics_missing_since_unix,
            engines=engines,
            liveness=self.liveness if up else _when_down(self.liveness),
            vllm_version=self.api_version or log.version,
            server_args=log.server_args,
            time_scale=self.time_scale,
            prefix_curve=None if self.prefix_curve is None else self.prefix_curve.view(capacity),
            kv_events=None if self.kv_feed is None else replace(self.kv_feed),
            log=LogView(
                capacity=log.capacity,
                events=dict(log.events),
                preemption_warnings=log.warnings,
                max_cumulative_preemptions=log.max_cumulative,
                repeat_warned_requests=log.repeat_warned_ids,
                stats=dict(log.stats),
                incidents=tuple(log.incidents.snapshot()),
                incidents_counted={w.value: n for w, n in log.incidents.counted.items()},
            ),
        )


def _when_down(liveness: Liveness | None) -> Liveness | None:
    """A target gone stale keeps only what the log said (dead); alive or stuck was a scrape's."""
    return liveness if liveness is not None and liveness.status is Status.DEAD else None


class SidecarState:
    def __init__(
        self,
        targets: list[str],
        thresholds: Thresholds | None = None,
        store: EpisodeStore | None = None,
        wall_clock: Callable[[], float] = time.time,
        stale_after_s: float = 10.0,
        model: Architecture | None = None,
        scheduling_policy: str | None = None,
    ) -> None:
        """`stale_after_s`: how long a target may go without a finished scrape before it shows
        as down (the daemon sets it from its interval and timeout). `model`: the served
        model's KV layout (`--model`), for block demand that follows its groups.
        `scheduling_policy`: the servers' --scheduling-policy as the operator gave it; None:
        as the log's launch line says (vLLM's fcfs where it says nothing)."""
        if not targets:
            raise ValueError("at least one target is needed")
        self.th = thresholds or Thresholds()
        self.store = store or EpisodeStore(None)
        self.wall_clock = wall_clock
        self.stale_after_s = stale_after_s
        self.model = model
        self.scheduling_policy = scheduling_policy
        self.loops = Supervisor(wall_clock)
        self.started_unix = wall_clock()
        self.store.close_dangling(self.started_unix)
        self._episode_counts = self.store.counts()
        self.transitions: deque[Transition] = deque(maxlen=_MAX_TRANSITIONS)
        self.targets = {url: TargetState(url) for url in targets}
        self.alerting = AlertingView()
        self.load_events: deque[LoadEvent] = deque(maxlen=_MAX_TRANSITIONS)
        self.load_stages: dict[str, float] = {}  # stages running now -> since (unix)
        self.log_target = targets[0]
        self.log_stats: FollowStats | None = None
        self.log_source: str | None = None
        self.heartbeat = time.monotonic()
        # every followed replica's reads in one curve (--kv-events on two targets or more)
        self.pooled_curve: ReuseCurve | None = None
        self._fleet_prefix_at: tuple[float, FleetPrefixView | None] | None = None
        self._lock = threading.Lock()

    def record_scrape(self, url: str, now: float, outcome: ScrapeOutcome) -> None:
        """One scrape's outcome at monotonic time `now`. Episodes are written after the lock is
        released: a slow disk must not keep /api/state and /metrics waiting."""
        unix = self.wall_clock()
        saves: list[Episode] = []
        with self._lock:
            self.heartbeat = now
            ts = self.targets[url]
            ts.scrapes += 1
            ts.last_duration_s = outcome.duration_s
            exp = outcome.exposition
            if exp is None:
                ts.up = False
                ts.api_version = None  # it may come back as another release
                ts.scrape_errors[outcome.error_reason or "unknown"] += 1
                ts.last_error = outcome.error
                ts.present = set()
                ts.health_failing_since_unix = None  # down is its own alert
                ts.judge_liveness(now, unix, self.th)
                ts.last_scrape_at = now
                return
            observed = observe(exp)
            if ts.take_time_scale(outcome.time_scale, now) and outcome.time_scale:
                _log.warning(
                    "%s is a kvwatch twin at time scale %g: judging it on its simulated clock "
                    "(rates per simulated second; windows and forecasts in simulated seconds, "
                    "%g wall seconds each; docs/twin.md)",
                    url,
                    outcome.time_scale,
                    outcome.time_scale,
                )
            judge_now = ts.clock(now)
            ts.up = True
            ts.last_error = None
            ts.last_success_unix = unix
            ts.parse_errors += exp.error_count
            ts.rejected.update(exp.rejected)
            ts.vllm_metrics_present = bool(observed)
            if observed:
                ts.metrics_missing_since_unix = None
            elif ts.metrics_missing_since_unix is None:
                ts.metrics_missing_since_unix = unix
            ts.present = set(observed)
            fallback = ts.log.cache_fallback()
            policy = self.scheduling_policy or ts.log.scheduling_policy()
            for key, obs in observed.items():
                ej = ts.engines.get(key)
                if ej is None:
                    before = self._episode_counts.get((url, *key), 0)
                    ej = ts.engines[key] = EngineJudge(url, key, self.th, before, self.model)
                judged = ej.observe(judge_now, unix, obs, fallback, policy, ts.time_scale)
                if judged.rejected:
                    ts.rejected["implausible_jump"] += 1
                if judged.histogram_refused:
                    ts.rejected["broken_histogram"] += 1
                if judged.transition is not None:
                    self.transitions.append(judged.transition)
                if judged.episode is not None:
                    saves.append(judged.episode)
            ts.judge_liveness(now, unix, self.th)
            # last: a scrape whose recording raised never counts as ended, so the target goes
            # stale (down) instead of showing its old figures as up
            ts.last_scrape_at = now
        for ep in saves:
            self.store.save(ep)

    def wants_version(self, url: str, now: float) -> bool:
        with self._lock:
            return self.targets[url].wants_version(now)

    def record_version(self, url: str, now: float, version: str | None) -> None:
        """What `GET /version` answered (None: nothing usable)."""
        with self._lock:
            ts = self.targets[url]
            ts.version_asked_at = now
            ts.api_version = version

    def record_health(self, url: str, now: float, ok: bool, detail: str = "") -> None:
        """What `GET /health` answered after a scrape that worked."""
        unix = self.wall_clock()
        with self._lock:
            ts = self.targets[url]
            if ok:
                ts.health_failing_since_unix, ts.health_detail = None, ""
            elif ts.up:
                if ts.health_failing_since_unix is None:
                    ts.health_failing_since_unix = unix
                ts.health_detail = detail
            ts.judge_liveness(now, unix, self.th)

    def record_log_lines(self, lines: list[str]) -> None:
        events = [ev for ev in map(parse_line, lines) if ev is not None]
        if not events:
            return
        with self._lock:
            ts = self.targets[self.log_target]
            for ev in events:
                ts.log.take(ev)
            # the stall is a fact of the scrapes: judged as of the last one
            at = time.monotonic() if ts.last_scrape_at is None else ts.last_scrape_at
            ts.judge_liveness(at, self.wall_clock(), self.th)

    def record_load_event(self, event: object) -> None:
        """A load generator's stage start or end, as `POST /api/events` received it: input
        from outside, checked here; ValueError says what is wrong."""
        if not isinstance(event, Mapping):
            raise ValueError('expected a JSON object {"event": ..., "stage": ...}')
        kind, stage = event.get("event"), event.get("stage")
        if kind not in ("stage_start", "stage_end") or not isinstance(stage, str) or not stage:
            raise ValueError('expected {"event": "stage_start"|"stage_end", "stage": NAME}')
        unix = event.get("unix")
        if unix is None:
            when = self.wall_clock()
        elif isinstance(unix, int | float) and not isinstance(unix, bool) and math.isfinite(unix):
            when = float(unix)
        else:
            raise ValueError("unix must be a finite number of seconds")
        name = stage[:200]
        with self._lock:
            opening = kind == "stage_start" and name not in self.load_stages
            if opening and len(self.load_stages) >= _MAX_OPEN_STAGES:
                raise ValueError(f"over {_MAX_OPEN_STAGES} stages open; end some first")
            self.load_events.append(LoadEvent(kind, name, when))
            if kind == "stage_start":
                self.load_stages[name] = when
            else:
                self.load_stages.pop(name, None)

    def follow_kv_events(self, url: str, stats: FeedStats) -> None:
        """`url`'s KV events are followed from now on, counted in `stats`. From the second
        target on, their reads also feed one pooled curve (the fleet's)."""
        with self._lock:
            ts = self.targets[url]
            ts.prefix_curve = PrefixCurve()
            ts.kv_feed = stats
            followed = sum(t.prefix_curve is not None for t in self.targets.values())
            if followed >= 2 and self.pooled_curve is None:
                self.pooled_curve = ReuseCurve(max_keys=2 * MAX_KEYS)

    def record_kv_batch(self, url: str, batch: Batch) -> None:
        with self._lock:
            curve = self.targets[url].prefix_curve
            if curve is not None:
                curve.feed(batch, self.pooled_curve)

    def record_kv_restart(self, url: str) -> None:
        """The publisher started again: the cache it describes is empty."""
        with self._lock:
            curve = self.targets[url].prefix_curve
            if curve is not None:
                curve.restart()

    def set_alerting(self, status: AlertingView) -> None:
        with self._lock:
            self.alerting = status

    def view(self, now: float | None = None) -> StateView:
        """Everything, at monotonic time `now` (for the heartbeat's age)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            log = None
            if self.log_stats is not None:
                log = LogSourceView(self.log_source or "", replace(self.log_stats))
            targets = tuple(ts.view(now, self.stale_after_s) for ts in self.targets.values())
            return StateView(
                started_unix=self.started_unix,
                heartbeat_age_s=now - self.heartbeat,
                thresholds=self.th,
                transitions=tuple(self.transitions)[-_SHOWN:],
                alerting=self.alerting,
                load_stages=dict(self.load_stages),
                load_events=tuple(self.load_events)[-_SHOWN:],
                log=log,
                targets=targets,
                loops=self.loops.status(),
                fleet_prefix=self._fleet_prefix_cached(targets, now),
            )

    def _fleet_prefix_cached(
        self, views: tuple[TargetView, ...], now: float
    ) -> FleetPrefixView | None:
        """The fleet's prefix figures, at most FLEET_PREFIX_REFRESH_S old (under the lock)."""
        got = self._fleet_prefix_at
        if got is None or not 0 <= now - got[0] < FLEET_PREFIX_REFRESH_S:
            got = self._fleet_prefix_at = (now, self._fleet_prefix(views))
        return got[1]

    def _fleet_prefix(self, views: tuple[TargetView, ...]) -> FleetPrefixView | None:
        """The followed replicas together, where they all serve one model (under the lock)."""
        if self.pooled_curve is None:
            return None
        replicas, models = [], set()
        for v in views:
            ts = self.targets[v.target]
            if ts.prefix_curve is None:
                continue
            models |= {e.model_name for e in v.engines}
            capacity = v.prefix_curve.capacity_blocks if v.prefix_curve is not None else None
            if capacity:
                c = ts.prefix_curve
                replicas.append(FleetReplica(v.target, c.table, c.curve, capacity))
        if len(models) != 1 or len(replicas) < 2:
            return None  # not yet known, or not one model's replicas
        return fleet_prefix_view(models.pop(), replicas, self.pooled_curve)

    def readings_json(self) -> dict[str, object]:
        """`GET /api/readings` (sidecar/contract/readings.py): each engine's timeline as the
        counters `kvwatch calibrate --sidecar` fits a step model to, in the judges' clock."""
        engines = []
        with self._lock:
            for ts in self.targets.values():
                scale = ts.time_scale or 1.0
                for (model, engine), ej in ts.engines.items():
                    rows = []
                    for t, obs in ej.timeline.points:
                        r = obs.calibration_reading(t, scale)
                        rows.append([getattr(r, name) for name in READING_FIELDS])
                    engines.append({"target": ts.url, "model": model, "engine": engine,
                                    "time_scale": ts.time_scale, "readings": rows})  # fmt: skip
        return {"format": READINGS_FORMAT, "fields": list(READING_FIELDS), "engines": engines}

    def episodes(self, limit: int = 50) -> list[Episode]:
        return self.store.recent(limit)
