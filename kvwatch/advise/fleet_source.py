"""Read what fleet advice needs from Prometheus: per model with two or more engines, the fleet
recordings (alerts/fleet.py) at the demand's peak in the window, how long the fleet was judged
imbalanced or short, and each engine's share of the requests and prompt tokens."""

from __future__ import annotations

from typing import Any

import httpx

from kvwatch.advise.prometheus import prometheus_query
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.vocabulary import (
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    promql_selector,
)
from kvwatch.sizing.fleet import EngineShare, FleetObserved

__all__ = ["fleets_from_prometheus"]

_F = cat.FLEET_BY


def _per_model(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for row in rows:
        try:
            v = float(row["value"][1])
        except (KeyError, ValueError, IndexError):
            continue
        if v == v:
            out[row["metric"].get(_F, "")] = v
    return out


def fleets_from_prometheus(base: str, window: str = "1h", step: str = "15s") -> list[FleetObserved]:
    """Every model with 2+ engines whose fleet recordings Prometheus holds (kvwatch's rules
    loaded); [] when it has none."""
    short, room = cat.REC_FLEET_SHORT.name, cat.REC_FLEET_ROOM.name
    demand, tokens = cat.REC_FLEET_DEMAND.name, cat.REC_FLEET_REQUEST_TOKENS.name
    step_s = float(step.rstrip("s"))
    with httpx.Client(timeout=30) as client:

        def q(promql: str) -> list[dict[str, Any]]:
            return prometheus_query(client, base, promql)

        engines = _per_model(q(f"max_over_time({cat.REC_FLEET_REPLICAS.name}[{window}])"))
        models = [m for m, n in engines.items() if n >= 2]
        if not models:
            return []
        peak = _per_model(q(f"max_over_time({demand}[{window}])"))
        # the request count and mean size, and the engines and capacity, at the peak's step
        at_peak = f"[{window}:{step}]"
        requests = _per_model(q(
            f"max_over_time((({demand} / on({_F}) {tokens}) and on({_F}) ({demand} >= on({_F}) "
            f"group_left() max_over_time({demand}[{window}]) * 0.999)){at_peak})"
        ))  # fmt: skip
        size = _per_model(q(f"avg_over_time({tokens}[{window}])"))
        capacity = _per_model(q(f"max_over_time({cat.REC_FLEET_CAPACITY.name}[{window}])"))
        live = _per_model(q(f"max_over_time({cat.REC_FLEET_REPLICAS.name}[{window}])"))
        imbalance = _per_model(q(
            f"count_over_time(({short} > 0 and on({_F}) {room} > 0){at_peak}) * {step_s:g}"
        ))  # fmt: skip
        shortage = _per_model(q(
            f"count_over_time(({short} > 0 and on({_F}) {room} == 0){at_peak}) * {step_s:g}"
        ))  # fmt: skip
        shares = _shares(q, window)
    out = []
    for m in sorted(models):
        if m not in peak or m not in capacity or m not in size:
            continue
        out.append(
            FleetObserved(
                model=m,
                engines=int(live.get(m, engines[m])),
                capacity_tokens=capacity[m],
                peak_requests=requests.get(m, peak[m] / size[m]),
                request_tokens=peak[m] / requests[m] if m in requests else size[m],
                imbalance_s=imbalance.get(m, 0.0),
                shortage_s=shortage.get(m, 0.0),
                window=window,
                shares=tuple(shares.get(m, [])),
            )  # fmt: skip
        )
    return out


def _shares(q: Any, window: str) -> dict[str, list[EngineShare]]:
    by = f"instance, engine, {_F}"

    def rows(promql: str) -> dict[tuple[str, str, str], float]:
        out = {}
        for row in q(promql):
            m = row["metric"]
            v = float(row["value"][1])
            if v == v:
                out[(m.get(_F, ""), m.get("instance", ""), m.get("engine", ""))] = v
        return out

    def share(sel: str) -> dict[tuple[str, str, str], float]:
        mine = f"sum by ({by}) (increase({sel}[{window}]))"
        return rows(
            f"{mine} / on({_F}) group_left() (sum by ({_F}) (increase({sel}[{window}])) > 0)"
        )

    req, prompt = share(promql_selector(REQUEST_SUCCESS)), share(promql_selector(PROMPT_TOKENS))
    pre = rows(f"sum by ({by}) (increase({promql_selector(PREEMPTIONS)}[{window}]))")
    kv = rows(f"max by ({by}) (max_over_time({promql_selector(KV_USAGE)}[{window}]))")
    out: dict[str, list[EngineShare]] = {}
    for key in sorted(set(req) | set(kv)):
        model, inst, eng = key
        out.setdefault(model, []).append(
            EngineShare(
                f"{inst} engine {eng}",
                req.get(key, 0.0),
                prompt.get(key, 0.0),
                pre.get(key, 0.0),
                kv.get(key, 0.0),
            )  # fmt: skip
        )
    return out
