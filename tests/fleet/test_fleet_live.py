"""A fleet from real parts (kvwatch/fleet/lab.py): two twins behind vllm-router on round robin,
a sidecar each, Prometheus discovering them with kvwatch's rules, Alertmanager as shipped.
A session workload that piles the long conversations on one replica: the fleet rules judge
imbalance and name that replica, the fleet page is not sent, and the fleet advice says to
change the routing, not the size. The rest of the proofs (cache-aware routing evening it out,
a shortage and the scale-out, a replica killed) are bench/bench_fleet.py's (docs/fleet.md)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest

from kvwatch.advise.fleet_source import fleets_from_prometheus
from kvwatch.dashboards.build import ROUTER_PANELS, build
from kvwatch.fleet.lab import Fleet, FleetSpec
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS
from kvwatch.sizing.fleet import advise_fleet
from tests.dashboards.live import Series, panel_queries, run_query, substitute
from tests.fleet.figures import fleet_figures
from tests.fleet.workloads import PileSpec, session_pile_trace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def test_round_robin_piles_long_sessions_on_one_replica_and_it_is_named(tmp_path: Path) -> None:
    pile = PileSpec(replicas=2, rate=4.0, duration_s=45)
    trace = tmp_path / "pile.jsonl"
    session_pile_trace(trace, pile)
    spec = FleetSpec(replicas=2, kv_blocks=900, policy="round_robin",
                     max_model_len=pile.long_max_tokens + pile.output_tokens + 64,
                     rules_for_scale=1 / 30)  # fmt: skip
    with Fleet(spec, work_dir=tmp_path / "fleet") as fleet:
        start, end, summary = fleet.run_load(
            tmp_path / "run", "--trace", str(trace), "--trace-block-tokens", str(pile.block_tokens)
        )
        # the imbalance page may still be in Alertmanager's group wait; then a few more rule
        # evaluations, in which a shortage page would have to show if one were coming
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            "KvwatchFleetImbalance" in n.names for n in fleet.receiver.notifications()
        ):
            time.sleep(0.5)
        time.sleep(4)
        figures = fleet_figures(fleet.prometheus, start, time.time())
        notes = fleet.receiver.notifications()
        (fleet_obs,) = fleets_from_prometheus(fleet.prometheus, window="5m", step="1s")
        router = _router_panels(fleet.prometheus, start, time.time())
        urls = {r.url for r in fleet.replicas}
    assert summary["overall"]["failed"] == 0
    piled, other = sorted(figures.replicas, key=lambda r: -r.prompt_share)
    # round robin split the requests evenly and the prompt tokens not at all
    assert 0.45 < piled.request_share < 0.55 and piled.prompt_share > 0.8, figures
    assert piled.preemptions > 0 and other.preemptions == 0, figures
    assert other.worst_state in ("ok", "pressure"), figures
    # judged imbalance on the piled replica, by name, through Alertmanager; never a shortage
    (fired,) = figures.fired["KvwatchFleetImbalance"]
    assert fired["instance"] == piled.instance
    assert "KvwatchFleetKvShortage" not in figures.fired
    sent = [n for n in notes if "KvwatchFleetImbalance" in n.names and n.status == "firing"]
    assert sent and sent[0].path == "/alerts"  # a warning: the default receiver, not the pager
    assert not [n for n in notes if "KvwatchFleetKvShortage" in n.names]
    # the advice: the routing, with the piled replica first in the evidence
    advice = advise_fleet(fleet_obs, DEFAULT_THRESHOLDS.pressure_kv)
    assert advice.judged == "imbalance", advice
    assert "cache_aware" in advice.options[0]
    assert advice.evidence[0].startswith(piled.instance), advice.evidence
    # the fleet dashboard's router panels, from the router's own metrics: round robin sent
    # each replica half the requests, and both passed its health check all along
    sent = {s.labels["worker"]: s for s in router[ROUTER_PANELS[0]]}
    assert set(sent) == urls, sent
    assert {s.labels["policy"] for s in sent.values()} == {"round_robin"}
    per_s = [sum(v for _, v in s.points if math.isfinite(v)) for s in sent.values()]
    assert min(per_s) > 0.8 * max(per_s), per_s
    health = router[ROUTER_PANELS[1]]
    assert len(health) == 2 and all(v == 1 for s in health for _, v in s.points), health


def _router_panels(prom: str, start: float, end: float) -> dict[str, list[Series]]:
    """The router panels' queries as Grafana would send them (no template variable in them)."""
    out = {}
    with httpx.Client(timeout=10) as client:
        for pq in panel_queries(build("kvwatch-fleet.json")):
            if pq.panel in ROUTER_PANELS:
                expr = substitute(pq.expr, {}, end - start, "5s")
                out[pq.panel] = run_query(client, prom, expr, start, end, pq.instant, 1.0)
    return out
