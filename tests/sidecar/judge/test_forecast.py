"""The KV-exhaustion forecast and KvwatchKvExhaustionImminent, on hand-made usage series."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.forecast import MIN_POINTS, forecast_exhaustion, line_fit
from kvwatch.sidecar.judge.pipeline import EngineJudge
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import CacheConfig, EngineObservation, observe
from kvwatch.sidecar.outputs.alerting import active_alerts
from kvwatch.sidecar.outputs.exporter import StateCollector

CACHE = CacheConfig(block_size=32, num_blocks=40)


def test_line_fit_recovers_a_line() -> None:
    slope, mt, mv = line_fit([(t, 0.1 + 0.02 * t) for t in range(10)])
    assert slope == pytest.approx(0.02)
    assert mv + slope * (9 - mt) == pytest.approx(0.28)


def test_a_steady_rise_is_forecast_where_the_line_meets_full() -> None:
    # no spread: the band is the line; 0.5 now, +1%/s: full in 50 s
    pts = [(t, 0.5 - 0.01 * (60 - t)) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds == pytest.approx(50.0)
    assert f.trend_per_s == pytest.approx(0.01)


def test_the_spread_lifts_the_band_towards_full() -> None:
    # the same rise with usage swinging +-0.1 around it: the cache runs out at a peak, sooner
    pts = [(t, 0.5 - 0.01 * (60 - t) + (0.1 if t % 2 else -0.1)) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds is not None
    assert f.seconds == pytest.approx((1.0 - f.band_now) / f.trend_per_s)
    assert 30.0 < f.seconds < 40.0  # the band sits about 1.5 x 0.1 above the line


def test_busy_but_flat_is_not_heading_for_exhaustion() -> None:
    pts = [(t, 0.6 + (0.2 if t % 3 == 0 else 0.0)) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds is None  # a slope of ~0 is no forecast


def test_a_band_already_at_full_says_now() -> None:
    pts = [(t, 0.8 if t % 2 else 1.0) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds == 0.0


def test_too_few_points_or_bad_values_give_no_forecast() -> None:
    few = [(float(t), 0.5) for t in range(MIN_POINTS - 1)]
    assert forecast_exhaustion(few, float(MIN_POINTS)) is None
    # points outside the window do not count; NaN is skipped, never a NaN forecast
    old = [(float(t), 0.1 * t) for t in range(10)]
    assert forecast_exhaustion(old, 1000.0) is None
    nan = [(float(t), math.nan if t % 2 else 0.01 * t) for t in range(20)]
    f = forecast_exhaustion(nan, 19.0)
    assert f is not None and f.seconds is not None and math.isfinite(f.seconds)


def _judge_ramp(th: Thresholds, usage: list[float]) -> tuple[EngineJudge, list[float | None]]:
    """Feed one usage per second; returns the judge and the imminent-since after each."""
    judge = EngineJudge("http://vllm", ("m", "0"), th, 0)
    seen = []
    for t, u in enumerate(usage):
        obs = EngineObservation(kv_usage=u, running=2, waiting=0, cache=CACHE)
        judge.observe(float(t), 1000.0 + t, obs, None)
        seen.append(judge.exhaustion_imminent_since)
    return judge, seen


def test_the_warning_holds_across_a_dip_and_clears_once_the_forecast_has() -> None:
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5)
    rise = [min(0.85, 0.3 + 0.01 * t) for t in range(50)]  # heading up, then flat at 85%
    judge, seen = _judge_ramp(th, rise + [0.85] * 120)
    first = next(i for i, s in enumerate(seen) if s is not None)
    assert first < 50  # warned while rising
    assert seen[-1] is None  # flat for two minutes: no longer heading for exhaustion
    assert judge.level is Level.OK


def test_a_step_from_idle_to_a_level_load_does_not_warn() -> None:
    """Idle, then a busy load that levels off at once (swinging 20-50% as requests come and
    go): a line through the window rises steeply for a while, but its forecast recedes."""
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5)
    swings = [0.2, 0.35, 0.5, 0.3, 0.45, 0.25, 0.4, 0.5, 0.3, 0.35]
    usage = [0.0] * 20 + [swings[t % len(swings)] for t in range(120)]
    judge, seen = _judge_ramp(th, usage)
    assert all(s is None for s in seen)
    # the forecast alone said "within the horizon" after the step: the countdown is what held
    forecasts = []
    for t in range(len(usage)):
        tl_usage = [(float(i), u) for i, u in enumerate(usage[: t + 1])]
        f = forecast_exhaustion(tl_usage, float(t))
        forecasts.append(None if f is None else f.seconds)
    assert any(f is not None and f <= th.exhaustion_warn_s for f in forecasts[20:60])


def test_a_forecast_that_appears_inside_the_horizon_waits_for_its_countdown() -> None:
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5, exhaustion_countdown_s=10)
    rise = [0.2] * 30 + [0.2 + 0.015 * t for t in range(40)]  # flat, then a steady climb
    _, seen = _judge_ramp(th, rise)
    first = next(i for i, s in enumerate(seen) if s is not None)
    assert 30 + 10 <= first < 70  # not before the climb has counted down for 10 s


def test_a_gap_in_the_scrapes_is_no_countdown() -> None:
    """After 12 s without a scrape (a stalled server), a forecast inside the horizon has nothing
    it counted down from: it waits for the next countdown like a new one."""
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=0, exhaustion_countdown_s=10)
    judge = EngineJudge("http://vllm", ("m", "0"), th, 0)
    times = [*range(20), *range(32, 60)]  # no scrape from 20 to 32 s
    seen = {}
    for t in times:
        u = 0.2 if t < 20 else 0.6 + 0.01 * (t - 32)  # flat, then found climbing
        obs = EngineObservation(kv_usage=u, running=2, waiting=0, cache=CACHE)
        judge.observe(float(t), 1000.0 + t, obs, None)
        seen[t] = judge.exhaustion_imminent_since
    # inside the horizon from 35 s, with nothing from 22-30 s it could have counted down from
    assert all(seen[t] is None for t in range(32, 41))
    assert seen[59] is not None  # it counts down over the next 10 s, and warns


def test_saturation_takes_over_from_the_warning() -> None:
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5, enter_after_s=0)
    judge = EngineJudge("http://vllm", ("m", "0"), th, 0)
    for t in range(40):
        obs = EngineObservation(kv_usage=0.3 + 0.015 * t, running=3, waiting=0, cache=CACHE)
        judge.observe(float(t), float(t), obs, None)
    assert judge.exhaustion_imminent_since is not None
    for t in range(40, 45):  # full, with requests waiting: saturated
        obs = EngineObservation(kv_usage=1.0, running=3, waiting=4, cache=CACHE)
        judge.observe(float(t), float(t), obs, None)
    assert judge.level >= Level.SATURATED
    assert judge.exhaustion_imminent_since is None  # at once: no double page


def test_the_alert_fires_after_its_for_with_the_forecast_in_its_text() -> None:
    from kvwatch.sidecar.metrics.exposition import parse_exposition
    from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
    from kvwatch.sidecar.state.sidecar_state import SidecarState
    from kvwatch.sidecar.store.episode_store import EpisodeStore

    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5)
    now = [1000.0]
    state = SidecarState(
        ["http://vllm"], th, EpisodeStore(None), stale_after_s=1e9, wall_clock=lambda: now[0]
    )
    fired_at = None
    for t in range(60):
        now[0] = 1000.0 + t
        usage = min(0.9, 0.3 + 0.012 * t)
        body = (
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
        )
        state.record_scrape("http://vllm", float(t), ScrapeOutcome(0.01, parse_exposition(body)))
        view = state.view(float(t))
        names = [a.name for a in active_alerts(view, th, 1000.0 + t + 0.5).active]
        if fired_at is None and "KvwatchKvExhaustionImminent" in names:
            fired_at = t
            (alert,) = [
                a
                for a in active_alerts(view, th, 1000.0 + t + 0.5).active
                if a.name == "KvwatchKvExhaustionImminent"
            ]
            assert alert.labels["severity"] == "warning" and alert.labels["engine"] == "0"
            assert "Forecast: out of blocks in" in alert.annotations["description"]
    assert fired_at is not None
    (engine,) = state.view(59.0).targets[0].engines
    since = engine.exhaustion_imminent_since_unix
    assert since is not None and fired_at >= since - 1000 + th.exhaustion_for_s - 1
    # the Prometheus rule reads the same condition from the exporter
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(lambda: state.view(59.0)))
    text = generate_latest(reg).decode()
    labels = 'engine="0",model_name="m",target="http://vllm"'
    assert f"kvwatch_kv_exhaustion_imminent{{{labels}}} 1.0" in text


RECORDINGS = Path(__file__).resolve().parents[3] / "bench" / "results" / "forecast"


def _replay(name: str, th: Thresholds, every: int = 1) -> tuple[list[float], float | None]:
    """A bench recording of the real fixture (bench/bench_forecast.py) through the judge: the
    times the warning fired (its `for` lasted), and when the cache was first full."""
    judge = EngineJudge("http://vllm", ("m", "0"), th, 0)
    fired: list[float] = []
    full_at = None
    rows = [json.loads(line) for line in (RECORDINGS / f"{name}.jsonl").read_text().splitlines()]
    for row in rows[::every]:
        (obs,) = observe(parse_exposition(row["body"])).values()
        judge.observe(row["t"], row["t"], obs, None)
        since = judge.exhaustion_imminent_since
        fresh = since is not None and (not fired or fired[-1] < since)  # not the last one
        if fresh and row["t"] - since >= th.exhaustion_for_s:
            fired.append(row["t"])
        if full_at is None and ((obs.kv_usage or 0) >= 1.0 or (obs.preemptions_total or 0) > 0):
            full_at = row["t"]
    return fired, full_at


@pytest.mark.parametrize("every", [1, 2])  # 0.5 s scrapes as recorded, and 1 s (the default)
@pytest.mark.parametrize("name", ["steadys-3", "steadyt-3"])
def test_a_server_that_slows_under_its_load_and_levels_short_of_full_is_not_warned(
    name: str, every: int
) -> None:
    """Paced for 2 in flight, then held to 0.9 cores: 4-6 ran, KV swung between 60% and 90-95%
    for a minute and never ran out. The band said "0 s" from 12-15 s on; those forecasts were
    proved wrong within seconds, and a warning not yet fired is dropped then. `steadyt-3` is
    the held-out run a 2 s slack still warned on (at 0.5 s scrapes, 0.1 s before the check)."""
    fired, full_at = _replay(name, Thresholds(), every)
    assert full_at is None and fired == []
    # the same run judged without the check: warned 17-22 s in (the false alert it removed;
    # 22 s for steadyt-3 at 1 s scrapes since the curve of sidecar/judge/forecast.py)
    fired, _ = _replay(name, Thresholds(exhaustion_refuted_factor=0), every)
    assert len(fired) == 1 and 15 < fired[0] < 23


@pytest.mark.parametrize("every", [1, 2])
def test_a_ramp_that_runs_out_is_still_warned_well_ahead(every: int) -> None:
    """`niced-0`, an even ramp into preemption: the check costs its warning no lead (17.4 s
    and 15.8 s ahead, as before it)."""
    fired, full_at = _replay("niced-0", Thresholds(), every)
    assert full_at is not None and fired and full_at - fired[0] > 15


def test_a_fill_still_rising_keeps_its_warning_when_a_forecast_came_too_soon() -> None:
    """`twin-qwen3moe-steady-0` (the MoE twin, Poisson 6.5 requests/s from idle): the curve
    said "0.4 s" at 77% and the cache ran out 8 s later, at 23.6 s. That forecast failed while
    usage kept rising 77% -> 98%, and the check on past forecasts dropped the warning; it
    proves a forecast wrong only where usage has stopped rising (`exhaustion_refuted_rise`)."""
    fired, full_at = _replay("twin-qwen3moe-steady-0", Thresholds())
    assert full_at is not None and fired and 2 < full_at - fired[0] < 5
    fired, _ = _replay("twin-qwen3moe-steady-0", Thresholds(exhaustion_refuted_rise=0))
    assert not [t for t in fired if t < full_at]


def test_a_fired_warning_whose_forecast_is_proved_wrong_lapses_like_any_other() -> None:
    """Once paged, a forecast proved wrong clears the warning after exit_after_s, not at once,
    so a forecast that comes and goes does not page twice. Without the check the band's "0 s"
    would hold it for the minute the climb stays in the window."""
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=5, exit_after_s=15)
    climb = [0.3 + 0.015 * t for t in range(40)]  # reaches 0.885 at 39 s
    _, seen = _judge_ramp(th, climb + [0.96, 0.9] * 30)  # then swings just short of full
    since = seen[39]
    assert since is not None and 39 - (since - 1000) >= 5  # fired while climbing
    cleared = next((i for i in range(40, len(seen)) if seen[i] is None), None)
    assert cleared is not None and cleared >= 40 + 15  # lapsed, then cleared
    assert all(s is None for s in seen[cleared:])  # and no second warning


@pytest.mark.parametrize(("top", "dropped"), [(1.0, False), (0.97, True)])
def test_a_forecast_that_comes_true_is_not_proved_wrong(top: float, dropped: bool) -> None:
    """A warning still pending (a long `for`) when its forecast's time has passed: kept when
    usage touched 100% since (the forecast came true), dropped when it peaked at 97%."""
    th = Thresholds(exhaustion_warn_s=30, exhaustion_for_s=20)
    climb = [0.3 + 0.02 * t for t in range(30)]
    _, seen = _judge_ramp(th, climb + [top, 0.9] * 15)
    onset = seen[29]
    assert onset is not None
    assert (seen[-1] is None) is dropped
    assert {s for s in seen if s is not None} == {onset}  # never dropped, then warned again


def test_a_smooth_rise_that_speeds_up_is_run_forward_on_its_curve() -> None:
    """A big cache under a growing load: usage rises smoothly and faster and faster. A line
    through the minute lags behind; the curve meets 100% where the rise does."""
    # u(t) = 0.1 + 0.0002 t^2, now = 60 (u = 0.82): full at sqrt(4500) = 67.08, 7.1 s from now
    pts = [(float(t), 0.1 + 0.0002 * t * t) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds == pytest.approx(7.08, rel=0.02)
    slope, mt, mv = line_fit(pts)
    line = (1.0 - (mv + slope * (60 - mt))) / slope  # what the minute's line says
    assert line > 1.5 * f.seconds


def test_a_small_caches_swings_keep_the_line() -> None:
    """The same rise with a block-sized swing on every scrape (40 blocks): the curve leaves the
    swings as they are, so the band of the line serves, as on the fixture."""
    pts = [(float(t), 0.1 + 0.0002 * t * t + (0.05 if t % 2 else -0.05)) for t in range(0, 61)]
    f = forecast_exhaustion(pts, 60.0)
    assert f is not None and f.seconds is not None
    slope, _, _ = line_fit(pts)
    assert f.trend_per_s == pytest.approx(slope)  # the line's, not the curve's


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("name", ["twin-llama8b-steady-6", "twin-qwen3moe-steady-4"])
def test_a_light_trace_is_not_warned_on_the_loads_forecast_alone(name: str, every: int) -> None:
    """Azure's conversation trace at a speed that fits (window 1800-1900 s; at 0.7x on the
    Llama twin, peak KV 30%; at 0.5x on the MoE, 26%). The load's forecast extrapolates the
    step time of batches of 3-20 that carry long prompts' prefill to the 85 that fill the
    cache, and said the cache would hold only 1-50% more arrivals; the usage was flat or a
    ten-minute rise. The load's forecast counts only where the usage band reaches 100%
    within `exhaustion_usage_check_s`."""
    fired, full_at = _replay(name, Thresholds(), every)
    assert full_at is None and fired == []
    fired, _ = _replay(name, Thresholds(exhaustion_usage_check_s=0), every)
    assert fired  # warned 1-3 times without the check
