from __future__ import annotations

import pytest

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.signals import derive
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.metrics.observe import CacheConfig, EngineObservation

CACHE = CacheConfig(block_size=32, num_blocks=40, kv_tokens=1280)


def obs(pre: float, gen: float = 0.0, **kw: float) -> EngineObservation:
    return EngineObservation(preemptions_total=pre, generation_tokens_total=gen, cache=CACHE, **kw)


class TestTimeline:
    def test_rate_and_increase(self) -> None:
        tl = Timeline()
        for t, v in [(0, 0), (1, 2), (2, 6), (3, 6)]:
            tl.add(t, obs(v))
        assert tl.increase("preemptions_total", 10, 3) == 6
        assert tl.rate("preemptions_total", 10, 3) == pytest.approx(2.0)
        assert tl.rate("preemptions_total", 1.5, 3) == 0.0  # points at t=2,3

    def test_restart_is_never_negative_nor_a_spike(self) -> None:
        tl = Timeline()
        for t, v in [(0, 500), (1, 510), (2, 520), (3, 3), (4, 5)]:  # restart before t=3
            tl.add(t, obs(v))
        assert tl.increase("preemptions_total", 10, 4) == 10 + 10 + 3 + 2
        assert tl.observed["preemptions_total"] == 25
        assert tl.resets == 1
        rates = [tl.rate("preemptions_total", 1.5, t) for t in (1, 2, 3, 4)]
        assert all(r is not None and 0 <= r <= 10 for r in rates)

    def test_bounded(self) -> None:
        tl = Timeline(max_points=5)
        for t in range(100):
            tl.add(t, obs(t))
        assert len(tl.points) == 5
        assert tl.observed["preemptions_total"] == 99

    def test_single_point_has_no_rate(self) -> None:
        tl = Timeline()
        tl.add(0, obs(1))
        assert tl.rate("preemptions_total", 10, 0) is None


class TestSignals:
    def test_hand_computed(self) -> None:
        tl = Timeline()
        tl.add(0.0, obs(0, 0, kv_usage=0.5, running=8))
        tl.add(2.0, obs(4, 400, kv_usage=0.75, running=8, waiting=3))
        s = derive(tl, 2.0, Thresholds(short_window_s=10, long_window_s=60))
        assert s is not None
        assert s.free_blocks == pytest.approx(10)  # 40 x 0.25
        assert s.free_tokens == pytest.approx(320)
        assert s.block_demand_per_step == pytest.approx(8 / 32)
        assert s.generation_tokens_per_s == pytest.approx(200)
        assert s.seconds_to_exhaustion is None  # two points: too few for a trend
        assert s.preemptions_per_s_short == pytest.approx(2)

    def test_capacity_falls_back_to_log(self) -> None:
        tl = Timeline()
        tl.add(0.0, EngineObservation(kv_usage=0.5, running=1))
        s = derive(tl, 0.0, Thresholds(), fallback=CacheConfig(kv_tokens=1000))
        assert s is not None and s.free_tokens == 500 and s.free_blocks is None
        assert s.seconds_to_exhaustion is None  # one point: no trend yet
