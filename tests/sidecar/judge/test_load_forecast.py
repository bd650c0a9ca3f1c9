"""The load's own forecast (sidecar/judge/load_forecast.py) on loads whose course is known: a
steady load levels where Little's law says, a load that does not fit says so at once, a growing
load counts down to when its demand passes the cache, and what cannot be known is None."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvwatch.sidecar.judge.load_forecast import forecast_from_load
from kvwatch.sidecar.metrics.observe import EngineObservation

PROMPT, OUTPUT, BLOCK = 1000, 500, 16
STEP_S = 0.02  # each running request gets a token every 20 ms


def _load(
    rate_at: float, trend: float = 0.0, seconds: int = 60, finished: int = 50,
    usage: float = 0.5, reset_at: float | None = None,
) -> list[tuple[float, EngineObservation]]:  # fmt: skip
    """Scrapes every 0.5 s of a load admitted at `rate_at` + `trend` x t requests/s (t from the
    first scrape), whose requests run OUTPUT x STEP_S seconds (Little's law: rate x that)."""
    out = []
    admitted = generated = 0.0
    for i in range(seconds * 2 + 1):
        t = i * 0.5
        rate = rate_at + trend * t
        running = rate * OUTPUT * STEP_S
        if i:
            admitted += (rate_at + trend * (t - 0.25)) * 0.5  # the interval's own mean rate
            generated += (rate_at + trend * (t - 0.25)) * OUTPUT * 0.5  # running / STEP_S
        if reset_at is not None and t >= reset_at:
            counted = admitted - rate_at * reset_at  # the server restarted: from zero again
        else:
            counted = admitted
        out.append((t, EngineObservation(
            kv_usage=usage, running=running, prompt_tokens_total=counted * PROMPT,
            generation_tokens_total=generated, prompt_len_sum=finished * PROMPT,
            prompt_len_count=finished, output_len_sum=finished * OUTPUT,
            output_len_count=finished,
        )))  # fmt: skip
    return out


def test_a_steady_load_levels_where_littles_law_says() -> None:
    pts = _load(4.0)
    got = forecast_from_load(pts, pts[-1][0], 10_000, BLOCK)
    assert got is not None
    assert got.admissions_per_s == pytest.approx(4.0, rel=1e-6)
    assert got.residence_s == pytest.approx(OUTPUT * STEP_S)
    per_request = (PROMPT + OUTPUT / 2) / BLOCK + 0.5
    assert got.blocks_per_request == pytest.approx(per_request)
    assert got.steady_demand_blocks == pytest.approx(4.0 * 10.0 * per_request)  # 3,145 blocks
    assert got.headroom == pytest.approx(10_000 / (40 * per_request) - 1)
    assert got.seconds is None  # it levels below the cache: no countdown, however busy


def test_a_load_that_does_not_fit_says_so_before_the_curve_could() -> None:
    pts = _load(16.0, usage=0.5)  # demands 12,580 blocks of 10,000
    got = forecast_from_load(pts, pts[-1][0], 10_000, BLOCK)
    assert got is not None and got.headroom < 0
    # 5,000 blocks to go at (12,580 - 5,000) / 10 s: 6.6 s
    assert got.seconds == pytest.approx(10.0 * 5_000 / (got.steady_demand_blocks - 5_000))


def test_a_growing_load_counts_down_to_when_its_demand_passes_the_cache() -> None:
    pts = _load(2.0, trend=0.1)  # 8 requests/s at the last scrape, rising 0.1/s
    now = pts[-1][0]
    got = forecast_from_load(pts, now, 10_000, BLOCK)
    assert got is not None
    assert got.admissions_per_s == pytest.approx(8.0, rel=1e-6)
    assert got.admissions_trend_per_s2 == pytest.approx(0.1, rel=1e-6)
    holds = 10_000 / (10.0 * got.blocks_per_request)  # 12.7 requests/s
    assert got.seconds == pytest.approx((holds - 8.0) / 0.1 + 5.0)


def test_a_restart_inside_the_window_leaves_the_rate_whole() -> None:
    pts = _load(4.0, reset_at=30.0)
    got = forecast_from_load(pts, pts[-1][0], 10_000, BLOCK)
    # the step across the restart is lost (the counter read 0 after it): 2 of 240 requests
    assert got is not None and got.admissions_per_s == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"finished": 0}, "no request has finished: no lengths"),
        ({"seconds": 4}, "too short a history for a rate"),
    ],
)
def test_what_cannot_be_known_is_none(change: dict[str, int], why: str) -> None:
    pts = _load(4.0, **change)  # type: ignore[arg-type]
    assert forecast_from_load(pts, pts[-1][0], 10_000, BLOCK) is None, why


def test_no_cache_size_or_nothing_running_is_none() -> None:
    pts = _load(4.0)
    now = pts[-1][0]
    assert forecast_from_load(pts, now, None, BLOCK) is None
    assert forecast_from_load(pts, now, 10_000, None) is None
    idle = [(t, replace(o, running=0.0)) for t, o in pts]
    assert forecast_from_load(idle, now, 10_000, BLOCK) is None


def test_hostile_counters_give_a_finite_figure_or_none() -> None:
    pts = _load(4.0)
    now = pts[-1][0]
    for bad in (math.inf, math.nan, -1e300, 1e300):
        spoiled = [(t, replace(o, prompt_tokens_total=bad)) if i % 7 == 3 else (t, o)
                   for i, (t, o) in enumerate(pts)]  # fmt: skip
        got = forecast_from_load(spoiled, now, 10_000, BLOCK)
        assert got is None or all(
            math.isfinite(v) for v in (got.admissions_per_s, got.steady_demand_blocks,
                                       got.headroom, got.seconds or 0.0)
        )  # fmt: skip


def test_the_countdown_takes_the_curve_where_it_fits_else_the_earlier() -> None:
    """sidecar/judge/signals.py's exhaustion_seconds: the curve is exact where usage rises
    smoothly; elsewhere the load's figure and the line's band, whichever is sooner."""
    from kvwatch.sidecar.judge.forecast import KvForecast
    from kvwatch.sidecar.judge.load_forecast import LoadForecast
    from kvwatch.sidecar.judge.signals import exhaustion_seconds

    def load(seconds: float | None) -> LoadForecast:
        return LoadForecast(4.0, 0.1, 10.0, 78.6, 3000.0, 0.5, seconds)

    curve = KvForecast(12.0, 0.01, 0.8, curved=True)
    band = KvForecast(40.0, 0.01, 0.8)
    assert exhaustion_seconds(curve, load(30.0)) == 12.0
    assert exhaustion_seconds(band, load(30.0)) == 30.0
    assert exhaustion_seconds(band, load(None)) == 40.0
    assert exhaustion_seconds(KvForecast(None, 0.0, 0.5), load(30.0)) == 30.0
    assert exhaustion_seconds(None, None) is None
    # with the usage as the check: the load's figure counts only where the band itself
    # reaches 100% within usage_check_s
    assert exhaustion_seconds(band, load(30.0), 300.0) == 30.0
    assert exhaustion_seconds(KvForecast(400.0, 0.001, 0.5), load(30.0), 300.0) == 400.0
    assert exhaustion_seconds(KvForecast(None, 0.0, 0.5), load(30.0), 300.0) is None
    assert exhaustion_seconds(None, load(30.0), 300.0) is None
    assert exhaustion_seconds(KvForecast(0.0, 0.01, 1.0), load(30.0), 300.0) == 0.0
