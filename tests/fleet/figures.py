"""What a run did to a fleet, read back from its Prometheus over the run's span: per replica
(engine) the peak KV usage, the preemptions, and its share of the requests and prompt tokens;
the fleet alerts that fired and on what; and what the sidecars judged."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kvwatch.common.promql import prometheus_query, values_by
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.vocabulary import (
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    promql_selector,
)

__all__ = ["ReplicaFigures", "FleetFigures", "fleet_figures"]


@dataclass(frozen=True)
class ReplicaFigures:
    instance: str
    peak_kv: float
    mean_kv: float
    short_share: float  # of the span, the share the fleet rules judged it out of KV
    preemptions: float
    request_share: float
    prompt_share: float
    worst_state: str  # the worst the replica's sidecar judged


@dataclass
class FleetFigures:
    span_s: float
    replicas: list[ReplicaFigures] = field(default_factory=list)
    fired: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # alert -> labels
    replicas_needed_max: float | None = None
    capacity_lost_tokens_max: float | None = None  # of engines down or dead
    capacity_tokens_min: float | None = None  # of the live engines

    @property
    def preemptions(self) -> float:
        return sum(r.preemptions for r in self.replicas)

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"preemptions": self.preemptions}


def fleet_figures(prometheus: str, start: float, end: float) -> FleetFigures:
    """Figures over [start, end] (wall seconds), evaluated at `end`."""
    span = max(1, round(end - start))
    w = f"[{span}s]"

    with httpx.Client(timeout=10) as client:

        def q(promql: str) -> list[dict[str, Any]]:
            return prometheus_query(client, prometheus, promql, at=end)

        def per_instance(promql: str) -> dict[str, float]:
            return values_by(q(promql), "instance")

        peak = per_instance(f"max by (instance) (max_over_time({promql_selector(KV_USAGE)}{w}))")
        mean = per_instance(f"avg_over_time({cat.REC_KV_USAGE.name}{w})")
        short = per_instance(f"avg_over_time({cat.REC_KV_SHORT.name}{w})")
        pre = per_instance(f"sum by (instance) (increase({promql_selector(PREEMPTIONS)}{w}))")

        def share(sel: str) -> dict[str, float]:
            mine = f"sum by (instance) (increase({sel}{w}))"
            return per_instance(f"{mine} / scalar(sum(increase({sel}{w})) > 0)")

        req, prompt = share(promql_selector(REQUEST_SUCCESS)), share(promql_selector(PROMPT_TOKENS))
        # the sidecar names vLLM by --target (a loopback URL here): its host:port is the instance
        worst = {
            row["metric"]["target"].removeprefix("http://"): cat.STATES[int(float(row["value"][1]))]
            for row in q(f"max by (target) (max_over_time({cat.STATE_LEVEL.series}{w}))")
        }
        figures = FleetFigures(span_s=float(span))
        for inst in sorted(set(peak) | set(pre)):
            figures.replicas.append(
                ReplicaFigures(
                    inst,
                    peak.get(inst, 0.0),
                    mean.get(inst, 0.0),
                    short.get(inst, 0.0),
                    pre.get(inst, 0.0),
                    req.get(inst, 0.0),
                    prompt.get(inst, 0.0),
                    worst.get(inst, "unknown"),
                )  # fmt: skip
            )
        fired = 'ALERTS{alertstate="firing", alertname=~"KvwatchFleet.*"}'
        for row in q(f"max_over_time({fired}{w})"):
            labels = {k: v for k, v in row["metric"].items() if k not in ("__name__", "alertstate")}
            figures.fired.setdefault(labels.pop("alertname"), []).append(labels)

        def most(promql: str) -> float | None:
            rows = q(promql)
            return float(rows[0]["value"][1]) if rows else None

        figures.replicas_needed_max = most(
            f"max(max_over_time({cat.REC_FLEET_REPLICAS_NEEDED.name}{w}))"
        )
        figures.capacity_lost_tokens_max = most(
            f"max(max_over_time({cat.REC_FLEET_CAPACITY_LOST.name}{w}))"
        )
        figures.capacity_tokens_min = most(f"min(min_over_time({cat.REC_FLEET_CAPACITY.name}{w}))")
    return figures
