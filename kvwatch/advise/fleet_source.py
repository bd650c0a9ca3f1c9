"""Read what fleet advice needs from Prometheus: per model with two or more engines, the fleet
recordings (alerts/fleet.py) at the demand's peak in the window, how long the fleet was judged
imbalanced or short, and each engine's share of the requests and prompt tokens."""

from __future__ import annotations

import time

import httpx

from kvwatch.common.promql import (
    prometheus_query,
    prometheus_range,
    series_by,
    value_at,
    values_by,
    values_by_labels,
)
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.catalogue import duration_seconds
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


def fleets_from_prometheus(base: str, window: str = "1h", step: str = "15s") -> list[FleetObserved]:
    """Every model with 2+ engines whose fleet recordings Prometheus holds (kvwatch's rules
    loaded); [] when it has none. The demand's peak is found over the window at `step` (at most
    the rules' evaluation interval); the requests, engines and capacity are read at that step."""
    short, room = cat.REC_FLEET_SHORT.name, cat.REC_FLEET_ROOM.name
    demand, tokens = cat.REC_FLEET_DEMAND.name, cat.REC_FLEET_REQUEST_TOKENS.name
    step_s = duration_seconds(step)
    end = time.time()
    start = end - duration_seconds(window)
    with httpx.Client(timeout=30) as client:

        def q(promql: str) -> dict[str, float]:
            return values_by(prometheus_query(client, base, promql), _F)

        def over_window(promql: str) -> dict[str, dict[float, float]]:
            return series_by(prometheus_range(client, base, promql, start, end, step_s), _F)

        engines = q(f"max_over_time({cat.REC_FLEET_REPLICAS.name}[{window}])")
        models = [m for m, n in engines.items() if n >= 2]
        if not models:
            return []
        demands = over_window(demand)
        requests = over_window(f"{demand} / on({_F}) {tokens}")
        live = over_window(cat.REC_FLEET_REPLICAS.name)
        capacity = over_window(cat.REC_FLEET_CAPACITY.name)
        judged = f"{short} > 0 and on({_F}) {room}"
        imbalance = q(f"count_over_time(({judged} > 0)[{window}:{step}]) * {step_s:g}")
        shortage = q(f"count_over_time(({judged} == 0)[{window}:{step}]) * {step_s:g}")
        shares = _shares(client, base, window)
    out = []
    for m in sorted(models):
        points = demands.get(m, {})
        peak_t = max(points, key=lambda t: points[t], default=None)
        if peak_t is None:
            continue  # no demand recorded: no finished request yet to size one by
        held = value_at(requests.get(m, {}), peak_t)
        kv = value_at(capacity.get(m, {}), peak_t)
        if not held or not kv:
            continue  # no request or no sidecar's capacity by the peak: nothing to size
        out.append(
            FleetObserved(
                model=m,
                engines=int(value_at(live.get(m, {}), peak_t) or engines[m]),
                capacity_tokens=kv,
                peak_requests=held,
                request_tokens=points[peak_t] / held,
                imbalance_s=imbalance.get(m, 0.0),
                shortage_s=shortage.get(m, 0.0),
                window=window,
                shares=tuple(shares.get(m, [])),
            )  # fmt: skip
        )
    return out


def _shares(client: httpx.Client, base: str, window: str) -> dict[str, list[EngineShare]]:
    by = f"instance, engine, {_F}"

    def rows(promql: str) -> dict[tuple[str, ...], float]:
        return values_by_labels(prometheus_query(client, base, promql), (_F, "instance", "engine"))

    def share(sel: str) -> dict[tuple[str, ...], float]:
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
