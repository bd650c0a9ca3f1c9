from __future__ import annotations

import pytest

from kvwatch.loadgen.workload.arrivals import Burst, Concurrency, Gamma, Poisson, Ramp
from kvwatch.loadgen.workload.schedule import Stage, StageSpecError, parse_stage, sweep_stages


class TestParseStage:
    def test_forms(self) -> None:
        assert parse_stage("poisson:rate=4@30s") == Stage("poisson:rate=4@30s", Poisson(4), 30.0)
        s = parse_stage("gamma:rate=2,burstiness=0.5@60")
        assert s.pattern == Gamma(2, 0.5) and s.duration_s == 60
        s = parse_stage("concurrency:n=16@45s#500")
        assert s.pattern == Concurrency(16) and (s.duration_s, s.count) == (45, 500)
        assert parse_stage("ramp:start=1,end=10@60s").pattern == Ramp(1, 10)
        assert parse_stage("ramp:start=1,end=10,poisson=1@60s").pattern == Ramp(1, 10, 1)
        assert parse_stage("burst:size=8,every=12@72s").pattern == Burst(8, 12.0)

    @pytest.mark.parametrize(
        ("spec", "why"),
        [
            ("poisson:rate=4", "needs a duration"),
            ("ramp:start=1,end=2#10", "needs a duration"),
            ("ramp:start=1,end=2,poisson=yes@5s", "not a whole number"),
            ("ramp:start=1,end=2,poisson=3@5s", "poisson must be 0 or 1"),
            ("zigzag:rate=1@5s", "unknown pattern"),
            ("poisson:speed=1@5s", "takes rate"),
            ("poisson:rate=fast@5s", "not a number"),
            ("poisson:rate=-1@5s", "positive"),
            ("gamma:rate=1@5s#x", "expected KIND"),
            ("concurrency@5s", "needs n"),
            ("burst:size=2.5,every=1@5s", "not a whole number"),
        ],
    )
    def test_errors_say_why(self, spec: str, why: str) -> None:
        with pytest.raises(StageSpecError, match=why):
            parse_stage(spec)


class TestSweep:
    def test_rate_and_concurrency(self) -> None:
        st = sweep_stages("rate", [1, 2.5], 10, None)
        assert [s.name for s in st] == ["rate=1", "rate=2.5"] and st[1].pattern == Poisson(2.5)
        assert sweep_stages("rate", [3], 5, None, burstiness=0.5)[0].pattern == Gamma(3, 0.5)
        st = sweep_stages("concurrency", [1, 8], None, 40)
        assert st[1].pattern == Concurrency(8) and st[1].count == 40

    def test_errors(self) -> None:
        with pytest.raises(StageSpecError):
            sweep_stages("concurrency", [1.5], 10, None)
        with pytest.raises(StageSpecError):
            sweep_stages("burst", [1], 10, None)
