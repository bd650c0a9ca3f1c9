"""The fleet's rules: one model's replicas judged together, where the fleet's data is.

Per engine (the replica's server, or one data-parallel engine of it): did it run out of KV
blocks in the last minute, and what share of the model's requests and prompt tokens did the
router send it. Per model: how many engines ran out and how many have room, the spread of KV
usage and preemptions between them, the KV the model's requests ask for (every request held or
waiting, at the mean final size of the requests finished over 5 minutes) against what its live
engines hold, and the engines seen in the last hour that are now down or dead.

Three judgements follow, and they exclude each other: an engine out of KV while another of its
model has room is imbalance (the routing, named per engine); engines out of KV with none left
with room is a shortage of the model (one page per model, which holds back the per-engine
pages); engines down or dead are lost capacity. KV capacity comes from the sidecars (vLLM
names its block count only in a label); everything else from vLLM's own series.
"""

from __future__ import annotations

from typing import Any

from kvwatch.alerts.rule import VLLM_INSTANCE, alert_rule
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.contract.vocabulary import (
    KV_USAGE,
    PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PROMPT_TOKENS,
    REQUEST_SUCCESS,
    promql_selector,
)
from kvwatch.sizing.fleet import ENGINE_SLACK

__all__ = ["fleet_groups"]

_BY = "instance, model_name, engine"
_F = cat.FLEET_BY


def _share(selector: str) -> str:
    """The engine's share of its model's rate of `selector` over 5m (absent while idle)."""
    mine = f"sum by ({_BY}) (rate({selector}[5m]))"
    return f"{mine} / on({_F}) group_left() (sum by ({_F}) (rate({selector}[5m])) > 0)"


def _mean(family: Any) -> str:
    """The mean of a vLLM per-request histogram over 5m, per model."""
    total = f"sum by ({_F}) (rate({promql_selector(family, suffix='sum')}[5m]))"
    count = f"sum by ({_F}) (rate({promql_selector(family, suffix='count')}[5m]))"
    return f"({total} / ({count} > 0))"


def _recordings(th: Thresholds, sidecar_job: str) -> list[dict[str, str]]:
    usage = cat.REC_KV_USAGE.name
    peak = f"max by ({_BY}) (max_over_time({promql_selector(KV_USAGE)}[1m]))"
    ran_out = f"({peak} >= bool {th.saturated_kv:g})"
    preempted = f"({cat.REC_PREEMPTION_RATE.name} > bool 0)"
    capacity = cat.KV_CACHE_CAPACITY_TOKENS.series
    live = f"on(instance, target) ({cat.TARGET_UP.series} == 1)"
    # the last hour's capacity of engines whose server the sidecar finds down or dead, or whose
    # sidecar Prometheus cannot scrape (a replica scaled away leaves discovery: not counted)
    seen = f"max_over_time({capacity}[1h])"
    down = (
        f"({seen} and on(instance, target) ({cat.TARGET_UP.series} == 0 or "
        f"{cat.ENGINE_ALIVE.series} == 0)) or "
        f'({seen} and on(instance) (up{{job="{sidecar_job}"}} == 0))'
    )
    none_down = f"(count by ({_F}) ({seen}) * 0)"
    # every request the model's engines hold or queue, at the typical request's final size
    present = f"sum by ({_F}) ({cat.REC_RUNNING.name} + {cat.REC_WAITING.name})"
    per_engine = (
        f"({cat.REC_FLEET_CAPACITY.name} / on({_F}) count by ({_F}) ({capacity} and {live}))"
    )
    rules = {
        cat.REC_KV_SHORT: f"clamp_max({ran_out} + {preempted}, 1) or {ran_out}",
        cat.REC_REQUEST_SHARE: _share(promql_selector(REQUEST_SUCCESS)),
        cat.REC_PROMPT_TOKEN_SHARE: _share(promql_selector(PROMPT_TOKENS)),
        cat.REC_FLEET_REPLICAS: f"count by ({_F}) ({usage})",
        cat.REC_FLEET_SHORT: f"sum by ({_F}) ({cat.REC_KV_SHORT.name})",
        cat.REC_FLEET_ROOM: (
            f"count by ({_F}) ({usage} < {th.pressure_kv:g} and on({_BY}) "
            f"{cat.REC_KV_SHORT.name} == 0) or on({_F}) (count by ({_F}) ({usage}) * 0)"
        ),
        cat.REC_FLEET_KV_MAX: f"max by ({_F}) ({usage})",
        cat.REC_FLEET_KV_MIN: f"min by ({_F}) ({usage})",
        cat.REC_FLEET_KV_SPREAD: f"max by ({_F}) ({usage}) - min by ({_F}) ({usage})",
        cat.REC_FLEET_PREEMPTION_SPREAD: (
            f"max by ({_F}) ({cat.REC_PREEMPTION_RATE.name}) - "
            f"min by ({_F}) ({cat.REC_PREEMPTION_RATE.name})"
        ),
        cat.REC_FLEET_REQUEST_TOKENS: (
            f"{_mean(REQUEST_PROMPT_TOKENS)} + {_mean(REQUEST_GENERATION_TOKENS)}"
        ),
        cat.REC_FLEET_CAPACITY: f"sum by ({_F}) ({capacity} and {live})",
        cat.REC_FLEET_DEMAND: f"{present} * on({_F}) {cat.REC_FLEET_REQUEST_TOKENS.name}",
        cat.REC_FLEET_HEADROOM: (
            f"({cat.REC_FLEET_CAPACITY.name} * {th.pressure_kv:g} - "
            f"{cat.REC_FLEET_DEMAND.name}) / {cat.REC_FLEET_REQUEST_TOKENS.name}"
        ),
        cat.REC_FLEET_REPLICAS_NEEDED: (
            f"clamp_min(ceil({cat.REC_FLEET_DEMAND.name} / ({per_engine} * {th.pressure_kv:g})"
            f" - {ENGINE_SLACK:g}), 1)"
        ),
        # 0, not absent, for a model whose engines are all up (a panel draws the 0)
        cat.REC_FLEET_DOWN: f"count by ({_F}) ({down}) or on({_F}) {none_down}",
        cat.REC_FLEET_CAPACITY_LOST: f"sum by ({_F}) ({down}) or on({_F}) {none_down}",
    }
    assert tuple(rules) == cat.FLEET_RECORDINGS, "the catalogue's order"
    return [{"record": r.name, "expr": expr} for r, expr in rules.items()]


def fleet_groups(
    th: Thresholds, sidecar_job: str = "kvwatch", for_scale: float = 1.0
) -> list[dict[str, Any]]:
    """The fleet's recording group and its alerting group."""
    short, room = cat.REC_FLEET_SHORT.name, cat.REC_FLEET_ROOM.name
    a, s = alert_rule, for_scale
    alerts = [
        # a model of one engine is one server: its own pages say it
        a("KvwatchFleetKvShortage",
          f"{short} > 0 and on({_F}) {room} == 0 and on({_F}) {cat.REC_FLEET_REPLICAS.name} > 1",
          th, None, s),
        a("KvwatchFleetImbalance",
          f"{cat.REC_KV_SHORT.name} == 1 and on({_F}) {room} > 0", th, VLLM_INSTANCE, s),
        a("KvwatchFleetReplicaDown", f"{cat.REC_FLEET_DOWN.name} > 0", th, None, s),
        # one sidecar follows the replicas' KV events: the gap is its figures' (max: the same
        # sidecar scraped twice, or two sidecars of one fleet, say one thing)
        a("KvwatchFleetPrefixCacheSplit",
          f"max by ({_F}) ({cat.FLEET_PREFIX_POOLED_HIT_RATIO.series}) - on({_F}) "
          f"max by ({_F}) ({cat.FLEET_PREFIX_REPLICAS_HIT_RATIO.series}) >= "
          f"{th.fleet_prefix_gap:g}", th, None, s),
    ]  # fmt: skip
    return [
        {"name": "kvwatch-fleet.rules", "rules": _recordings(th, sidecar_job)},
        {"name": "kvwatch-fleet.alerts", "rules": alerts},
    ]
