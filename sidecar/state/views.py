"""What the sidecar knows, as frozen typed values: what the exporter, the alerts, advice and the
JSON API read. Built under the state's lock in one go, so no reader sees a half-updated state;
`state_json` is the `/api/state` document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar, get_args, get_type_hints

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.episodes import Episode
from kvwatch.sidecar.judge.fleet_prefix import FleetPrefixView
from kvwatch.sidecar.judge.liveness import Liveness
from kvwatch.sidecar.judge.pipeline import Transition
from kvwatch.sidecar.judge.prefix_curve import PrefixCurveView
from kvwatch.sidecar.judge.signals import EngineSignals
from kvwatch.sidecar.judge.stall_seconds import SERVER_CAUSES, StallCount
from kvwatch.sidecar.kvevents.sequence import FeedStats
from kvwatch.sidecar.logs.follow import FollowStats
from kvwatch.sidecar.logs.incidents import Incident
from kvwatch.sidecar.logs.logformats import Capacity, StatsLine, event_to_dict
from kvwatch.sidecar.state.supervise import LoopStatus
from kvwatch.sidecar.store.outbox import DeliveryStats
from kvwatch.sizing.advice import FleetPrefixSeen, PrefixCurveSeen
from kvwatch.sizing.levers import ServerInfo, valid_version

_D = TypeVar("_D")

__all__ = [
    "EngineView", "LogView", "TargetView", "FiringAlert", "AlertingView", "LoadEvent",
    "LogSourceView", "StateView", "state_json", "engine_json", "engines_from_json",
    "servers_from_json", "prefix_curve_json", "prefix_curves_from_json", "fleet_prefix_from_json",
]  # fmt: skip


@dataclass(frozen=True)
class EngineView:
    model_name: str
    engine: str
    present: bool  # in the target's last successful scrape
    level: Level
    reasons: tuple[str, ...]
    episodes: int  # begun, across sidecar restarts
    episode: Episode | None  # the one open now (a copy)
    signals: EngineSignals
    model_error: str | None = None  # --model does not match the server's own KV figures
    # the forecast has said the cache runs out within exhaustion_warn_s since then
    exhaustion_imminent_since_unix: float | None = None
    # the prefix cache has lost reusable prefixes since then (sidecar/judge/prefix_cache.py)
    prefix_cache_thrashing_since_unix: float | None = None
    prefix_cache_reasons: tuple[str, ...] = ()
    # stalls in the ITL histogram since the sidecar began, by cause (judge/stall_seconds.py)
    stalls: Mapping[str, StallCount] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return self.level.label


@dataclass(frozen=True)
class LogView:
    capacity: Capacity | None
    events: Mapping[str, int]
    preemption_warnings: int
    max_cumulative_preemptions: int
    repeat_warned_requests: int
    stats: Mapping[str, StatsLine]
    incidents: tuple[Incident, ...] = ()  # the latest, oldest first
    incidents_counted: Mapping[str, int] = field(default_factory=dict)  # every one, by kind


@dataclass(frozen=True)
class TargetView:
    target: str
    up: bool | None  # None until the first scrape ends
    scrapes: int
    scrape_errors: Mapping[str, int]
    parse_errors: int
    rejected_samples: Mapping[str, int]  # refused as untrue (NaN, out of range, duplicate...)
    last_error: str | None
    last_scrape_duration_s: float | None
    last_success_unix: float | None
    vllm_metrics_present: bool | None
    metrics_missing_since_unix: float | None  # answering without engine series since then
    engines: tuple[EngineView, ...]
    log: LogView
    liveness: Liveness | None = None  # the engine alive, dead or stuck (None: unknown)
    vllm_version: str | None = None  # GET /version, else the log's startup banner
    server_args: tuple[tuple[str, str], ...] = ()  # the log's `non-default args` (secrets hidden)
    time_scale: float | None = None  # a kvwatch twin's (judged in wall time); None: real
    # from the server's KV events (--kv-events); None where none are followed
    prefix_curve: PrefixCurveView | None = None
    kv_events: FeedStats | None = None


@dataclass(frozen=True)
class FiringAlert:
    """One of the sidecar's own alerts, firing since `starts_at` (unix)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float


@dataclass(frozen=True)
class AlertingView:
    firing: tuple[FiringAlert, ...] = ()
    webhooks: Mapping[str, DeliveryStats] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadEvent:
    """A load generator's stage start or end (`kvwatch loadgen run --sidecar URL`)."""

    event: str
    stage: str
    unix: float


@dataclass(frozen=True)
class LogSourceView:
    source: str
    stats: FollowStats  # a copy


@dataclass(frozen=True)
class StateView:
    started_unix: float
    heartbeat_age_s: float
    thresholds: Thresholds
    transitions: tuple[Transition, ...]
    alerting: AlertingView
    load_stages: Mapping[str, float]  # running now -> since (unix)
    load_events: tuple[LoadEvent, ...]
    log: LogSourceView | None
    targets: tuple[TargetView, ...]
    loops: Mapping[str, LoopStatus] = field(default_factory=dict)  # background loops' health
    # the followed replicas' prefix caches together (--kv-events on one model's replicas)
    fleet_prefix: FleetPrefixView | None = None

    @property
    def failing_loops(self) -> tuple[str, ...]:
        return tuple(name for name, st in self.loops.items() if st.failing)


def engine_json(e: EngineView) -> dict[str, Any]:
    return {
        "model_name": e.model_name,
        "engine": e.engine,
        "present": e.present,
        "state": e.state,
        "state_level": int(e.level),
        "state_reasons": list(e.reasons),
        "episodes": e.episodes,
        "episode": None if e.episode is None else e.episode.to_dict(),
        "signals": e.signals.to_dict(),
        "model_error": e.model_error,
        "exhaustion_imminent_since_unix": e.exhaustion_imminent_since_unix,
        "prefix_cache_thrashing_since_unix": e.prefix_cache_thrashing_since_unix,
        "prefix_cache_reasons": list(e.prefix_cache_reasons),
        "stalls": {cause: asdict(c) for cause, c in e.stalls.items()},
    }


def prefix_curve_json(c: PrefixCurveView) -> dict[str, Any]:
    return {
        "capacity_blocks": c.capacity_blocks,
        "points": [
            {"blocks": p.blocks, "factor": p.factor, "hit_ratio": p.hit_ratio} for p in c.points
        ],
        "hit_ratio_now": c.hit_ratio_now,
        "ideal_hit_ratio": c.ideal_hit_ratio,
        "working_set_blocks": c.working_set_blocks,
        "queries": c.queries,
        "restored_blocks": c.restored_blocks,
        "sample_rate": c.sample_rate,
        "source": c.source,
        "counts": asdict(c.counts),
    }


def _target_json(t: TargetView) -> dict[str, Any]:
    log = t.log
    return {
        "target": t.target,
        "up": t.up,
        "scrapes": t.scrapes,
        "scrape_errors": dict(t.scrape_errors),
        "parse_errors": t.parse_errors,
        "rejected_samples": dict(t.rejected_samples),
        "last_error": t.last_error,
        "last_scrape_duration_s": t.last_scrape_duration_s,
        "last_success_unix": t.last_success_unix,
        "vllm_metrics_present": t.vllm_metrics_present,
        "metrics_missing_since_unix": t.metrics_missing_since_unix,
        "engine_status": None if t.liveness is None else t.liveness.status.value,
        "engine_status_reason": None if t.liveness is None else t.liveness.reason,
        "engine_status_since_unix": None if t.liveness is None else t.liveness.since_unix,
        "vllm_version": t.vllm_version,
        "server_args": dict(t.server_args),
        "time_scale": t.time_scale,
        "engines": [engine_json(e) for e in t.engines],
        "kv_events": None if t.kv_events is None else asdict(t.kv_events),
        "prefix_curve": None if t.prefix_curve is None else prefix_curve_json(t.prefix_curve),
        "log": {
            "capacity": None if log.capacity is None else event_to_dict(log.capacity),
            "events": dict(log.events),
            "preemption_warnings": log.preemption_warnings,
            "max_cumulative_preemptions": log.max_cumulative_preemptions,
            "repeat_warned_requests": log.repeat_warned_requests,
            "stats": {k: event_to_dict(v) for k, v in log.stats.items()},
            "incidents": [i.to_dict() for i in log.incidents],
            "incidents_counted": dict(log.incidents_counted),
        },
    }


def _transition_json(tr: Transition) -> dict[str, Any]:
    return {
        "unix": tr.unix,
        "target": tr.target,
        "model_name": tr.model_name,
        "engine": tr.engine,
        "from": tr.from_state,
        "to": tr.to_state,
        "reasons": list(tr.reasons),
    }


def state_json(v: StateView) -> dict[str, Any]:
    """The `/api/state` document."""
    return {
        "started_unix": v.started_unix,
        "heartbeat_age_s": v.heartbeat_age_s,
        "thresholds": asdict(v.thresholds),
        "transitions": [_transition_json(tr) for tr in v.transitions],
        "alerting": {
            "firing": [
                {
                    "name": a.name,
                    "labels": dict(a.labels),
                    "annotations": dict(a.annotations),
                    "starts_at": a.starts_at,
                }
                for a in v.alerting.firing
            ],
            "webhooks": {r: asdict(s) for r, s in v.alerting.webhooks.items()},
        },
        "load": {
            "stages": dict(v.load_stages),
            "events": [asdict(e) for e in v.load_events],
        },
        "log": None if v.log is None else {"source": v.log.source, **asdict(v.log.stats)},
        "targets": [_target_json(t) for t in v.targets],
        "loops": {name: asdict(st) for name, st in v.loops.items()},
        "fleet_prefix": None if v.fleet_prefix is None else _fleet_prefix_json(v.fleet_prefix),
    }


def _fleet_prefix_json(f: FleetPrefixView) -> dict[str, Any]:
    return {**asdict(f), "targets": list(f.targets), "routing_gap": f.routing_gap}


def engines_from_json(doc: object) -> list[tuple[str, EngineView]]:
    """(target, engine) for every engine in an `/api/state` document another sidecar served:
    input from outside, so every field is checked; ValueError says what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
        raise ValueError("not a kvwatch /api/state document (no targets list)")
    out = []
    for t in doc["targets"]:
        if not isinstance(t, dict) or not isinstance(t.get("target"), str):
            raise ValueError("a target without its URL")
        engines = t.get("engines") or []
        if not isinstance(engines, list):
            raise ValueError(f"{t['target'][:100]}: engines is not a list")
        for e in engines:
            out.append((t["target"], _engine_from_json(e)))
    return out


def _share(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
        raise ValueError(f"a hit ratio of {str(v)[:40]}")
    return float(v)


def _blocks(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 1 << 40:
        raise ValueError(f"a block count of {str(v)[:40]}")
    return v


def prefix_curves_from_json(doc: object) -> dict[str, PrefixCurveSeen]:
    """Each target's prefix-cache curve (`--kv-events`) from an `/api/state` document: input
    from outside, checked field by field (ValueError says what is wrong); a target without one,
    or whose curve has no reads yet, is left out."""
    out: dict[str, PrefixCurveSeen] = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
        return out
    for t in doc["targets"]:
        if not isinstance(t, dict) or not isinstance(t.get("target"), str):
            continue
        c = t.get("prefix_curve")
        if c is None:
            continue
        where = t["target"][:100]
        if not isinstance(c, dict) or not isinstance(c.get("points"), list):
            raise ValueError(f"{where}: prefix_curve is not a curve")
        if c.get("ideal_hit_ratio") is None or not c["points"]:
            continue
        try:
            points = tuple(sorted((_blocks(p.get("blocks")), _share(p.get("hit_ratio")))
                                  for p in c["points"] if isinstance(p, dict)))  # fmt: skip
            ws = c.get("working_set_blocks")
            out[t["target"]] = PrefixCurveSeen(
                points=points,
                ideal=_share(c["ideal_hit_ratio"]),
                working_set_blocks=None if ws is None else _blocks(ws),
                source=str(c.get("source"))[:40],
            )
        except ValueError as e:
            raise ValueError(f"{where}: prefix_curve: {e}") from None
    return out


def fleet_prefix_from_json(doc: object) -> FleetPrefixSeen | None:
    """The replicas' prefix caches together (`fleet_prefix`) from an `/api/state` document,
    checked (ValueError); None where the sidecar follows no fleet."""
    if not isinstance(doc, dict) or doc.get("fleet_prefix") is None:
        return None
    f = doc["fleet_prefix"]
    if not isinstance(f, dict) or not isinstance(f.get("targets"), list):
        raise ValueError("fleet_prefix is not a fleet's")
    try:
        if any(f.get(k) is None for k in ("duplicated_share", "replicas_hit_ratio",
                                          "pooled_hit_ratio")):  # fmt: skip
            return None
        return FleetPrefixSeen(
            targets=tuple(str(t)[:200] for t in f["targets"]),
            duplicated_share=_share(f["duplicated_share"]),
            replicas_hit_ratio=_share(f["replicas_hit_ratio"]),
            pooled_hit_ratio=_share(f["pooled_hit_ratio"]),
        )
    except ValueError as e:
        raise ValueError(f"fleet_prefix: {e}") from None


def servers_from_json(doc: object) -> dict[str, ServerInfo]:
    """Each target's vLLM version and non-default args from an `/api/state` document (fields a
    sidecar before 0.x did not write are left unknown)."""
    out: dict[str, ServerInfo] = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
        return out
    for t in doc["targets"]:
        if not isinstance(t, dict) or not isinstance(t.get("target"), str):
            continue
        args = t.get("server_args")
        pairs = (
            tuple(sorted((str(k), str(v)[:200]) for k, v in args.items()))
            if isinstance(args, dict)
            else ()
        )
        out[t["target"]] = ServerInfo(valid_version(t.get("vllm_version")), pairs)
    return out


def _engine_from_json(e: object) -> EngineView:
    if not isinstance(e, dict):
        raise ValueError("an engine that is not an object")
    try:
        level = Level[str(e["state"]).upper()]
        episode = e.get("episode")
        return EngineView(
            model_name=str(e["model_name"]),
            engine=str(e["engine"]),
            present=bool(e["present"]),
            level=level,
            reasons=tuple(str(r) for r in e.get("state_reasons") or ()),
            episodes=_count(e.get("episodes")),
            episode=None if episode is None else _typed(Episode, episode),
            signals=_typed(EngineSignals, e["signals"]),
            model_error=None if e.get("model_error") is None else str(e["model_error"]),
            exhaustion_imminent_since_unix=_number_or_none(e.get("exhaustion_imminent_since_unix")),
            prefix_cache_thrashing_since_unix=_number_or_none(
                e.get("prefix_cache_thrashing_since_unix")
            ),
            prefix_cache_reasons=tuple(str(r) for r in e.get("prefix_cache_reasons") or ()),
            stalls=_stalls(e.get("stalls")),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"an engine without a readable {str(err)[:200]}") from None


def _stalls(v: object) -> dict[str, StallCount]:
    """Stalls by cause (absent in an older sidecar's document: none); a cause this release
    does not know is left out, a count that is not a finite number from 0 refused."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError("stalls is not an object")
    out = {}
    for cause in SERVER_CAUSES:
        if cause in v:
            c = _typed(StallCount, v[cause])
            if c.stalls < 0 or c.seconds < 0:
                raise ValueError(f"stalls.{cause}: below 0")
            out[cause] = c
    return out


def _count(v: object) -> int:
    """A count of episodes: a whole number from 0 (absent or null: 0); anything else refused."""
    if v is None:
        return 0
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise TypeError(f"episodes {v!r} is not a count")


def _number_or_none(v: object) -> float | None:
    """A finite number as a float, or None (absent, null); anything else is refused."""
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise TypeError(f"{v!r} is not a finite number")


def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field's allowed types: `float | None` -> (float, NoneType)."""
    out = {}
    for name, hint in get_type_hints(cls).items():
        out[name] = get_args(hint) or (hint,)
    return out


def _typed(cls: type[_D], d: object) -> _D:
    """A dataclass from a JSON object, each field of its declared type: a number finite (and
    whole for an int), a string a string; ValueError says which field is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__}: not an object")
    values: dict[str, Any] = {}
    types = _field_types(cls)
    for f in fields(cls):  # type: ignore[arg-type]
        allowed, v = types[f.name], d.get(f.name)
        if v is None and type(None) in allowed:
            values[f.name] = None
        elif isinstance(v, str) and str in allowed:
            values[f.name] = v
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            if float in allowed:
                values[f.name] = float(v)
            elif int in allowed and float(v).is_integer():
                values[f.name] = int(v)
            else:
                raise ValueError(f"{cls.__name__}.{f.name}: {v!r} is not a whole number")
        else:
            raise ValueError(f"{cls.__name__}.{f.name}: {v!r} is not what it should be")
    return cls(**values)
