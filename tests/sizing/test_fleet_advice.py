"""advise_fleet's three verdicts from measured fleet figures: shortage (how many replicas, with
the recording's arithmetic, and the other levers), imbalance (routing, with each engine's
evidence) and fits. Pure: no Prometheus, the figures are given."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.fleet import EngineShare, FleetObserved, advise_fleet

# the shortage proof's figures (docs/fleet.md): 2 engines of 14,400 tokens, 30 streams of 1,536
SHORT = FleetObserved(
    model="meta-llama/Llama-3.1-8B-Instruct",
    engines=2,
    capacity_tokens=28_800,
    peak_requests=30,
    request_tokens=1_536,
    imbalance_s=0,
    shortage_s=60,
    window="10m",
    shares=(
        EngineShare("a:8000", 0.5, 0.5, 98, 1.0),
        EngineShare("b:8000", 0.5, 0.5, 98, 1.0),
    ),
)


def test_shortage_names_the_replicas_the_recording_would() -> None:
    adv = advise_fleet(SHORT, pressure_kv=0.9)
    # ceil(30 x 1,536 / (14,400 x 0.9)) = ceil(46,080 / 12,960) = 4
    assert adv.judged == "shortage" and adv.replicas_now == 2 and adv.replicas_needed == 4
    assert "needs 4 engines of this size, the fleet has 2" in adv.verdict
    assert adv.options[0].startswith("2 more replica(s) (4 in all)")
    assert "engines = ceil(46,080 / 12,960) = 4" in adv.arithmetic
    assert any("--tensor-parallel-size 2" in o for o in adv.options)
    assert not any("--kv-cache-memory-bytes" in o for o in adv.options)  # bytes/token unknown


def test_shortage_offers_kv_memory_per_replica_when_bytes_per_token_are_known() -> None:
    per_token = 131_072  # Llama 3.1 8B, bf16: 32 layers x 8 KV heads x 128 x 2 x 2 bytes
    adv = advise_fleet(replace(SHORT, kv_bytes_per_token=per_token), pressure_kv=0.9)
    (mem,) = [o for o in adv.options if "--kv-cache-memory-bytes" in o]
    want = math.ceil(30 * 1_536 / 2 / 0.9 * per_token)
    assert f"--kv-cache-memory-bytes {want} " in mem and "for 2 replicas" in mem


def test_shortage_where_the_mean_fits_still_adds_one() -> None:
    """Every engine ran out though the mean-size sum fits: longer-than-mean requests or
    bursts. The advice never says 'enough' to a fleet that ran out."""
    obs = replace(SHORT, peak_requests=10)  # 15,360 tokens: 2 engines by the mean
    adv = advise_fleet(obs, pressure_kv=0.9)
    assert adv.judged == "shortage" and adv.replicas_needed == 3
    assert any("one more, then re-check" in line for line in adv.arithmetic)


def test_imbalance_says_routing_with_the_piled_engine_first() -> None:
    obs = replace(
        SHORT,
        peak_requests=8,
        request_tokens=2_000,
        imbalance_s=70,
        shortage_s=0,
        shares=(
            EngineShare("b:8000", 0.5, 0.04, 0, 0.01),
            EngineShare("a:8000", 0.5, 0.96, 19, 1.0),
        ),
    )
    adv = advise_fleet(obs, pressure_kv=0.9)
    assert adv.judged == "imbalance" and adv.replicas_needed == 2
    assert "fits 2 of its 2 engines: the routing, not the size" in adv.verdict
    assert "cache_aware" in adv.options[0] and len(adv.options) == 2
    assert adv.evidence[0].startswith("a:8000: 50% of requests, 96% of prompt tokens, 19")


def test_imbalance_whose_queue_counts_as_demand_does_not_claim_it_fits() -> None:
    obs = replace(SHORT, imbalance_s=70, shortage_s=10)  # demand reads 4 engines' worth
    adv = advise_fleet(obs, pressure_kv=0.9)
    assert adv.judged == "imbalance"
    assert "fits" not in adv.verdict and "routing first" in adv.verdict
    assert adv.options[-1].startswith("the demand would need 4 engines even spread evenly")


def test_fits_when_no_engine_ran_out() -> None:
    adv = advise_fleet(replace(SHORT, shortage_s=0, peak_requests=4), pressure_kv=0.9)
    assert adv.judged == "fits" and adv.options == [] and adv.replicas_needed == 1
    assert adv.verdict.startswith("fits")


@pytest.mark.parametrize(
    "broken", [{"engines": 0}, {"capacity_tokens": 0.0}, {"request_tokens": float("nan")}]
)
def test_figures_that_cannot_be_sized_are_refused(broken: dict[str, float]) -> None:
    with pytest.raises(SizingError, match="no engines, KV capacity or finished requests"):
        replace(SHORT, **broken)  # type: ignore[arg-type]
