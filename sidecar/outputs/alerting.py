"""The sidecar's own alerts: which are active now, and what changed since the last look.

Names, severities, windows and texts come from sidecar/contract/catalogue.py, which the Prometheus
rules and the runbook share. An alert is keyed by a fingerprint of its labels; the tracker turns the
active set into firing, repeat and resolved notifications, and keeps what is firing in SQLite so a
restarted sidecar neither re-announces nor forgets an alert (the table: store/firing_store.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Collection
from dataclasses import dataclass, field

from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.state.views import EngineView, FiringAlert, StateView
from kvwatch.sidecar.store.firing_store import FiringRow, FiringStore

__all__ = ["Alert", "AlertSet", "active_alerts", "AlertTracker", "Notification"]


@dataclass(frozen=True)
class Alert:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]

    @property
    def fingerprint(self) -> str:
        blob = json.dumps({"alertname": self.name, **self.labels}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Notification:
    """`valid_until` (firing only): when a receiver may take the alert as resolved if no word
    came since, the sidecar being gone (two repeat intervals: a live sidecar re-sends in one)."""

    status: str  # "firing" or "resolved"
    alert: Alert
    starts_at: float
    ends_at: float | None = None
    repeat: bool = False
    valid_until: float | None = None


def _episode_text(e: EngineView) -> str:
    ep = e.episode
    if ep is None:
        return ""
    return (
        f" Episode so far: {ep.preemptions:.0f} preemptions, "
        f"{ep.repeat_preempted:.0f} repeat victims, peak KV {ep.peak_kv:.0%}, "
        f"~{ep.tokens_recomputed:,.0f} tokens recomputed."
    )


def _advice_text(e: EngineView) -> str:
    s = e.signals
    if not (s.capacity_blocks and s.block_size and s.peak_demand_long):
        return ""
    return (
        f" Peak demand {s.peak_demand_long:.0f} requests on {s.capacity_blocks} blocks "
        f"of {s.block_size} tokens: run `kvwatch advise --sidecar` for the settings."
    )


def _forecast_text(e: EngineView) -> str:
    s = e.signals
    if s.seconds_to_exhaustion is None or s.kv_usage is None:
        return ""
    rise = "" if s.kv_usage_trend_per_s is None else f", rising {s.kv_usage_trend_per_s:.1%}/s"
    return (
        f"Forecast: out of blocks in {s.seconds_to_exhaustion:.0f} s; KV usage "
        f"{s.kv_usage:.0%} now{rise}.{_load_text(e)}{_advice_text(e)}"
    )


def _load_text(e: EngineView) -> str:
    """The load's own view: what it holds when it levels, against the cache."""
    s = e.signals
    if s.steady_demand_blocks is None or s.load_headroom is None or not s.capacity_blocks:
        return ""
    fits = (
        f"the cache holds {s.load_headroom:.0%} more arrivals"
        if s.load_headroom >= 0
        else "it does not fit"
    )
    return (
        f" This load levels at {s.steady_demand_blocks:,.0f} of {s.capacity_blocks:,} blocks: "
        f"{fits}."
    )


def _raise(
    spec: cat.Alert, th: Thresholds, labels: dict[str, str], detail: str = "", **values: str
) -> Alert:
    """The catalogue's alert with these labels; `detail` is what only the sidecar saw."""
    summary, description = spec.texts(th, **labels, **values)
    return Alert(
        spec.name,
        {**labels, "severity": spec.severity},
        {
            "summary": summary,
            "description": f"{description} {detail}".strip(),
            "runbook_url": spec.runbook_url(th),
        },
    )


_TARGET_DOWN = cat.alert("KvwatchTargetDown")
_METRICS_MISSING = cat.alert("KvwatchVllmMetricsMissing")
_ENGINE_DEAD = cat.alert("KvwatchEngineDead")
_EXHAUSTION = cat.alert("KvwatchKvExhaustionImminent")
_PREFIX_CACHE = cat.alert("KvwatchPrefixCacheThrashing")
# An engine's state and the forecast need a window of scrapes to judge; a target's up or down
# is known at once.
_JUDGED_FROM_HISTORY = frozenset(
    {a.name for a in cat.ALERTS if a.level is not None} | {_EXHAUSTION.name}
)


def _engine_fingerprints(e: EngineView, labels: dict[str, str]) -> list[str]:
    """The fingerprints an engine's alerts would have: what to hold while it cannot be seen."""
    specs = [_EXHAUSTION, cat.alert_for_level(e.level)]
    return [
        Alert(s.name, {**labels, "severity": s.severity}, {}).fingerprint
        for s in specs
        if s is not None
    ]


@dataclass(frozen=True)
class AlertSet:
    """The alerts that hold now, and the fingerprints of those whose condition holds but has
    not yet lasted their `for` (pending, in Prometheus' words)."""

    active: list[Alert]
    holding: frozenset[str] = frozenset()


def active_alerts(view: StateView, th: Thresholds, now_unix: float) -> AlertSet:
    """Alerts that hold in this state view. An engine's state alert holds while it is in that
    state (the detector's hold is its `for`); the rest hold once their condition has lasted
    the alert's `for`, the same window the Prometheus rule waits."""
    out = []
    holding = set()

    def timed(spec: cat.Alert, since: float | None, labels: dict[str, str], detail: str) -> None:
        if since is None:
            return
        lasted = now_unix - since
        a = _raise(spec, th, labels, detail, down_for=cat.human_duration(lasted))
        if lasted >= spec.for_seconds(th):
            out.append(a)
        else:
            holding.add(a.fingerprint)

    for t in view.targets:
        target = {"target": t.target}
        down_since = (t.last_success_unix or view.started_unix) if t.up is False else None
        timed(_TARGET_DOWN, down_since, target, f"Last error: {t.last_error}")
        # A scrape that times out under load says nothing about the engines: their alerts hold
        # (neither resolved nor sent again) until a scrape judges them afresh, or until the
        # target has been down long enough for KvwatchTargetDown to take over.
        down_for = None if down_since is None else now_unix - down_since
        hold_engines = down_for is not None and down_for < _TARGET_DOWN.for_seconds(th)
        timed(
            _METRICS_MISSING,
            t.metrics_missing_since_unix if t.up and t.vllm_metrics_present is False else None,
            target,
            "",
        )
        timed(
            _ENGINE_DEAD,
            None if t.liveness is None else t.liveness.since_unix,
            target,
            "" if t.liveness is None else f"It is {t.liveness.status}: {t.liveness.reason}.",
        )
        for e in t.engines:
            labels = {**target, "model_name": e.model_name, "engine": e.engine}
            if not e.present:
                if hold_engines:
                    holding.update(_engine_fingerprints(e, labels))
                continue
            timed(_EXHAUSTION, e.exhaustion_imminent_since_unix, labels, _forecast_text(e))
            prefix = f"Now: {'; '.join(e.prefix_cache_reasons)}." if e.prefix_cache_reasons else ""
            timed(_PREFIX_CACHE, e.prefix_cache_thrashing_since_unix, labels, prefix)
            level_alert = cat.alert_for_level(e.level)
            if level_alert is not None:
                detail = f"Now: {'; '.join(e.reasons)}.{_episode_text(e)}{_advice_text(e)}"
                out.append(_raise(level_alert, th, labels, detail))
    return AlertSet(out, frozenset(holding))


@dataclass
class _Firing:
    alert: Alert
    starts_at: float
    last_sent: float


@dataclass
class AlertTracker:
    """Turns successive active sets into notifications; what fires survives in SQLite.

    A restarted sidecar knows nothing of its engines until it has scraped them for a while, so
    an engine's alert it restored from the database is not resolved before `hold_restored_s`
    have passed since `started` (one continuous episode across a restart is one firing and one
    resolved).
    An alert whose condition holds but has not yet lasted its `for` (`holding`) keeps firing if
    it fired, as in Prometheus: a restart does not restart a target's "down since"."""

    store: FiringStore
    repeat_interval_s: float
    hold_restored_s: float = 0.0
    started: float = 0.0
    firing: dict[str, _Firing] = field(default_factory=dict)
    restored: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        with self._lock:
            for row in self.store.rows():
                alert = Alert(row.name, row.labels, row.annotations)
                self.firing[row.fingerprint] = _Firing(alert, row.starts_at, row.last_sent)
                if row.name in _JUDGED_FROM_HISTORY:
                    self.restored.add(row.fingerprint)

    def update(
        self, active: list[Alert], now: float, holding: Collection[str] = ()
    ) -> list[Notification]:
        """`holding`: fingerprints whose condition holds but has not lasted its `for` yet."""
        out: list[Notification] = []
        warming = now - self.started < self.hold_restored_s
        until = now + 2 * self.repeat_interval_s
        with self._lock, self.store.batch():
            seen = set(holding) | (self.restored if warming else set())
            for a in active:
                fp = a.fingerprint
                seen.add(fp)
                f = self.firing.get(fp)
                if f is None:
                    f = self.firing[fp] = _Firing(a, now, now)
                    out.append(Notification("firing", a, now, valid_until=until))
                elif now - f.last_sent >= self.repeat_interval_s:
                    f.alert, f.last_sent = a, now
                    out.append(
                        Notification("firing", a, f.starts_at, repeat=True, valid_until=until)
                    )
                else:
                    # the newest figures for the resolve message; kept in memory only, so a
                    # firing alert costs no write per tick (a restart resolves with older ones)
                    f.alert = a
                    continue
                self.store.save(
                    FiringRow(
                        fp,
                        f.alert.name,
                        f.alert.labels,
                        f.alert.annotations,
                        f.starts_at,
                        f.last_sent,
                    )
                )
            if not warming:
                self.restored.clear()
            for fp in [fp for fp in self.firing if fp not in seen]:
                f = self.firing.pop(fp)
                out.append(Notification("resolved", f.alert, f.starts_at, ends_at=now))
                self.store.drop(fp)
        return out

    def firing_now(self) -> tuple[FiringAlert, ...]:
        with self._lock:
            return tuple(
                FiringAlert(f.alert.name, f.alert.labels, f.alert.annotations, f.starts_at)
                for f in self.firing.values()
            )
