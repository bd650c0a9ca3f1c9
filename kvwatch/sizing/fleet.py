"""Advice for one model's fleet (its replicas behind a router), from what the fleet recordings
measured (alerts/fleet.py): is it short of KV, and how many replicas end that, or does one replica
run out while others have room, and what routing change ends that. Pure: the figures come in,
the advice and its arithmetic go out.

The arithmetic is the recording's, so the advice, the page and the autoscaler say one number:
demand = every request the engines run or queue x the mean final tokens of a finished request;
replicas = ceil(demand / (the mean engine's KV capacity x the pressure line) - ENGINE_SLACK).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvwatch.sizing.errors import SizingError

__all__ = ["EngineShare", "FleetObserved", "FleetAdvice", "advise_fleet", "ENGINE_SLACK"]

# A thousandth of an engine, taken off before the ceiling: demand is a sum of rates over every
# replica, and its float noise (70.0000000001 engines at 100 replicas) must not add an engine.
ENGINE_SLACK = 0.001


@dataclass(frozen=True)
class EngineShare:
    name: str  # instance (and engine)
    request_share: float  # of the model's finished requests over the window
    prompt_share: float  # of its prompt tokens
    preemptions: float
    peak_kv: float  # the highest KV usage seen


@dataclass(frozen=True)
class FleetObserved:
    model: str
    engines: int  # engines reporting at the demand's peak
    capacity_tokens: float  # their KV capacity together, in tokens
    peak_requests: float  # requests run or queued at the demand's peak
    request_tokens: float  # mean final tokens of a finished request then
    imbalance_s: float  # seconds an engine ran out while another had room
    shortage_s: float  # seconds engines ran out with none left with room
    window: str
    shares: tuple[EngineShare, ...] = ()
    kv_bytes_per_token: float | None = None  # for the memory-per-replica lever

    def __post_init__(self) -> None:
        if self.engines < 1 or not self.capacity_tokens > 0 or not self.request_tokens > 0:
            raise SizingError(f"{self.model}: no engines, KV capacity or finished requests")


@dataclass
class FleetAdvice:
    model: str
    verdict: str
    judged: str  # "shortage", "imbalance" or "fits"
    replicas_now: int
    replicas_needed: int
    options: list[str] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gib(b: float) -> str:
    return f"{b / 2**30:,.2f} GiB"


def advise_fleet(obs: FleetObserved, pressure_kv: float) -> FleetAdvice:
    per_engine = obs.capacity_tokens / obs.engines
    demand = obs.peak_requests * obs.request_tokens
    needed = max(1, math.ceil(demand / (per_engine * pressure_kv) - ENGINE_SLACK))
    a = [
        f"demand at its peak = {obs.peak_requests:,.0f} requests run or queued x "
        f"{obs.request_tokens:,.0f} tokens (mean final size) = {demand:,.0f} tokens",
        f"an engine holds {per_engine:,.0f} tokens ({obs.engines} engines, "
        f"{obs.capacity_tokens:,.0f} together); below {pressure_kv:.0%}: "
        f"{per_engine * pressure_kv:,.0f}",
        f"engines = ceil({demand:,.0f} / {per_engine * pressure_kv:,.0f}) = {needed}",
        f"over the last {obs.window}: an engine out of KV while another had room for "
        f"{obs.imbalance_s:,.0f} s; engines out of KV with none left with room for "
        f"{obs.shortage_s:,.0f} s",
    ]
    evidence = [
        f"{s.name}: {s.request_share:.0%} of requests, {s.prompt_share:.0%} of prompt tokens, "
        f"{s.preemptions:,.0f} preemptions, KV peak {s.peak_kv:.0%}"
        for s in sorted(obs.shares, key=lambda s: -s.prompt_share)
    ]
    advice = FleetAdvice(obs.model, "", "fits", obs.engines, needed, [], a, evidence)
    if obs.shortage_s > 0 and obs.shortage_s >= obs.imbalance_s:
        advice.judged = "shortage"
        more = max(needed - obs.engines, 1)
        advice.replicas_needed = max(needed, obs.engines + 1)
        if needed <= obs.engines:
            a.append(
                f"the mean-size arithmetic fits {needed} engines, yet every one ran out: the "
                "requests are longer than the mean or come in bursts; one more, then re-check"
            )
        advice.verdict = (
            f"short of KV: every engine ran out or sat above {pressure_kv:.0%}; the demand "
            f"needs {advice.replicas_needed} engines of this size, the fleet has {obs.engines}"
        )
        advice.options.append(
            f"{more} more replica(s) ({advice.replicas_needed} in all) behind the router"
        )
        if obs.kv_bytes_per_token:
            per = demand / obs.engines / pressure_kv * obs.kv_bytes_per_token
            advice.options.append(
                f"or KV memory per replica: --kv-cache-memory-bytes {math.ceil(per)} "
                f"({_gib(per)} each, for {obs.engines} replicas)"
            )
        advice.options.append(
            "or --tensor-parallel-size 2 per replica (about twice the blocks per GPU's KV "
            "memory; twice the GPUs)"
        )
    elif obs.imbalance_s > 0:
        advice.judged = "imbalance"
        fits = (
            f"the fleet's demand fits {needed} of its {obs.engines} engines: the routing, "
            "not the size"
            if needed <= obs.engines
            else "the routing first (the queue the piled replica built counts as demand "
            "until it drains)"
        )
        advice.verdict = f"imbalanced: an engine ran out of KV while another had room; {fits}"
        advice.options += [
            "route by cache and load: vllm-router --policy cache_aware (it balances once "
            "queues differ by --balance-abs-threshold) or llm-d's KV-aware scheduling",
            "bound session affinity (sticky or consistent-hash routing pins long "
            "conversations to one replica)",
        ]
        if needed > obs.engines:
            advice.options.append(
                f"the demand would need {needed} engines even spread evenly: add "
                f"{needed - obs.engines} replica(s) as well"
            )
    else:
        advice.verdict = "fits: no engine ran out of KV in the window"
    return advice
