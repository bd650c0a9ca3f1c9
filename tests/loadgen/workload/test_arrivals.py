from __future__ import annotations

import random
import statistics

import pytest

from kvwatch.loadgen.workload.arrivals import (
    Burst,
    Concurrency,
    Constant,
    Gamma,
    Poisson,
    Ramp,
    describe,
)


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip(offsets, offsets[1:], strict=False)]


class TestConstant:
    def test_exact_spacing(self) -> None:
        offs = list(Constant(4).offsets(random.Random(0), 2.0))
        assert offs == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75])


class TestPoisson:
    def test_mean_rate_and_seeded(self) -> None:
        a = list(Poisson(50).offsets(random.Random(1), 200.0))
        b = list(Poisson(50).offsets(random.Random(1), 200.0))
        assert a == b
        assert len(a) / 200 == pytest.approx(50, rel=0.03)
        g = gaps(a)
        assert statistics.stdev(g) / statistics.mean(g) == pytest.approx(1.0, rel=0.05)


class TestGamma:
    @pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
    def test_rate_kept_and_cv_follows_burstiness(self, burstiness: float) -> None:
        offs = list(Gamma(40, burstiness).offsets(random.Random(2), 300.0))
        assert len(offs) / 300 == pytest.approx(40, rel=0.05)
        g = gaps(offs)
        cv = statistics.stdev(g) / statistics.mean(g)
        assert cv == pytest.approx(burstiness**-0.5, rel=0.08)


class TestRamp:
    def test_count_is_the_integral_and_rate_grows(self) -> None:
        offs = list(Ramp(1, 9).offsets(random.Random(0), 10.0))
        assert len(offs) == pytest.approx(50, abs=1)  # (1 + 9) / 2 x 10
        first, last = gaps(offs[:5]), gaps(offs[-5:])
        assert statistics.mean(first) > 3 * statistics.mean(last)

    def test_a_poisson_ramp_has_the_rate_and_the_scatter(self) -> None:
        """The same rate as the even ramp, with Poisson gaps: exponential around the local
        mean (coefficient of variation 1 over a stretch where the rate barely moves)."""
        offs = list(Ramp(2, 2, poisson=1).offsets(random.Random(3), 2000.0))
        assert len(offs) == pytest.approx(4000, rel=0.05)
        g = gaps(offs)
        assert statistics.pstdev(g) / statistics.mean(g) == pytest.approx(1.0, rel=0.08)
        ramp = Ramp(1, 9, poisson=1)
        counts = [len(list(ramp.offsets(random.Random(s), 10.0))) for s in range(200)]
        assert statistics.mean(counts) == pytest.approx(50, rel=0.05)
        assert statistics.pvariance(counts) == pytest.approx(50, rel=0.3)  # Poisson: var = mean
        assert list(Ramp(1, 9, poisson=1).offsets(random.Random(5), 10.0)) == list(
            Ramp(1, 9, poisson=1).offsets(random.Random(5), 10.0)
        )  # seeded

    def test_a_bursty_ramp_has_the_rate_and_gamma_gaps(self) -> None:
        """`burstiness=0.25`: the ramp's rate with gaps as `gamma` draws them (cv 2 where the
        rate barely moves), and the count still the rate's integral on average."""
        offs = list(Ramp(2, 2, burstiness=0.25).offsets(random.Random(3), 2000.0))
        assert len(offs) == pytest.approx(4000, rel=0.1)
        g = gaps(offs)
        assert statistics.pstdev(g) / statistics.mean(g) == pytest.approx(2.0, rel=0.1)
        ramp = Ramp(1, 9, burstiness=0.25)
        counts = [len(list(ramp.offsets(random.Random(s), 10.0))) for s in range(300)]
        assert statistics.mean(counts) == pytest.approx(50, rel=0.08)
        assert describe(ramp) == "1\u21929 req/s ramp, bursty (0.25)"
        with pytest.raises(ValueError, match="burstiness"):
            Ramp(1, 9, burstiness=0.0)

    def test_down_ramp_and_flat(self) -> None:
        assert len(list(Ramp(10, 0).offsets(random.Random(0), 10.0))) == pytest.approx(50, abs=1)
        assert len(list(Ramp(2, 2).offsets(random.Random(0), 10.0))) == 20


class TestBurst:
    def test_spikes(self) -> None:
        offs = list(Burst(3, 2.5).offsets(random.Random(0), 6.0))
        assert offs == [0, 0, 0, 2.5, 2.5, 2.5, 5.0, 5.0, 5.0]


class TestValidation:
    @pytest.mark.parametrize(
        "make",
        [
            lambda: Poisson(0),
            lambda: Constant(-1),
            lambda: Gamma(1, 0),
            lambda: Ramp(0, 0),
            lambda: Ramp(1, 2, poisson=2),
            lambda: Burst(0, 1),
            lambda: Burst(2, 0),
            lambda: Concurrency(0),
            lambda: Poisson(float("inf")),
        ],
    )
    def test_bad_values(self, make: object) -> None:
        with pytest.raises(ValueError):
            make()  # type: ignore[operator]


class TestBunches:
    def test_counts_what_is_due_together(self) -> None:
        from kvwatch.loadgen.send.runner import _bunched

        offs = [0, 0, 0, 0.5, 0.505, 1.0]
        assert list(_bunched(iter(offs), 0.01)) == [
            (0, 3), (0, 2), (0, 1), (0.5, 2), (0.505, 1), (1.0, 1),
        ]  # fmt: skip
        spikes = list(_bunched(Burst(8, 12).offsets(random.Random(0), 30), 0.01))
        assert [n for _, n in spikes][:9] == [8, 7, 6, 5, 4, 3, 2, 1, 8]

    def test_reads_ahead_only_as_far_as_the_window(self) -> None:
        import itertools

        from kvwatch.loadgen.send.runner import _bunched

        first = next(_bunched(itertools.count(0, 0.004), 0.01))  # an endless schedule
        assert first == (0, 3)
