"""Prefix-cache thrashing: the reference hit share from the server's own history, the prompt
tokens computed again, and the judgement held and cleared as the alert expects."""

from __future__ import annotations

import pytest

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.pipeline import EngineJudge
from kvwatch.sidecar.judge.prefix_cache import (
    PrefixCacheView,
    prefix_cache_thrashing,
    prefix_cache_view,
)
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.metrics.observe import CacheConfig, EngineObservation

CACHE = CacheConfig(block_size=16, num_blocks=8000)


def _obs(cached: float, computed: float) -> EngineObservation:
    return EngineObservation(
        kv_usage=0.5, running=8, waiting=0, cache=CACHE, prompt_tokens_total=cached + computed,
        generation_tokens_total=0.0, preemptions_total=0.0,
        prompt_tokens_cached_total=cached, prompt_tokens_computed_total=computed,
    )  # fmt: skip


def _feed(shares: list[float], tokens_per_s: float = 1000.0) -> list[EngineObservation]:
    """One observation a second: `tokens_per_s` prompt tokens, the share of them cached."""
    cached = computed = 0.0
    out = []
    for s in shares:
        cached += tokens_per_s * s
        computed += tokens_per_s * (1 - s)
        out.append(_obs(cached, computed))
    return out


def _timeline(shares: list[float], tokens_per_s: float = 1000.0) -> Timeline:
    tl = Timeline()
    for t, o in enumerate(_feed(shares, tokens_per_s)):
        tl.add(float(t), o)
    return tl


class TestView:
    def test_the_reference_is_what_the_windows_reached_and_the_loss_is_recomputed(self) -> None:
        th = Thresholds()
        tl = _timeline([0.8] * 300 + [0.2] * 30)
        now = 329.0
        v = prefix_cache_view(tl, now, th, hit_share=0.2, prompt_tokens_per_s=1000.0)
        assert v.reference_share == pytest.approx(0.8)
        assert v.recomputed_tokens_per_s == pytest.approx(600.0)

    def test_windows_without_enough_traffic_do_not_count(self) -> None:
        th = Thresholds(prefix_min_prompt_tokens_per_s=50)
        tl = _timeline([0.9] * 100, tokens_per_s=10.0)  # 100 tokens a window: below 500
        v = prefix_cache_view(tl, 99.0, th, hit_share=0.1, prompt_tokens_per_s=10.0)
        assert v.reference_share is None and v.recomputed_tokens_per_s is None

    def test_the_lookback_forgets(self) -> None:
        th = Thresholds(prefix_reference_window_s=60)
        tl = _timeline([0.8] * 100 + [0.3] * 120)
        v = prefix_cache_view(tl, 219.0, th, hit_share=0.3, prompt_tokens_per_s=1000.0)
        assert v.reference_share == pytest.approx(0.3)

    def test_a_counter_reset_is_not_a_burst_of_hits(self) -> None:
        th = Thresholds()
        tl = Timeline()
        obs = _feed([0.5] * 60)
        for t, o in enumerate(obs[:30] + [_obs(0.0, 0.0)] + obs[:29]):  # vLLM restarted
            tl.add(float(t), o)
        v = prefix_cache_view(tl, 59.0, th, hit_share=0.5, prompt_tokens_per_s=1000.0)
        assert v.reference_share is not None and v.reference_share <= 0.5 + 1e-9


class TestCondition:
    th = Thresholds()

    @pytest.mark.parametrize(
        ("view", "why"),
        [
            (PrefixCacheView(0.7, 0.8, 1000.0, 100.0), None),  # fell, but not by a fifth
            (PrefixCacheView(0.1, 0.15, 1000.0, 50.0), None),  # no reuse worth keeping
            (PrefixCacheView(0.0, 0.8, 10.0, 8.0), None),  # too little traffic to judge
            (PrefixCacheView(None, 0.8, 1000.0, None), None),
        ],
    )
    def test_quiet(self, view: PrefixCacheView, why: None) -> None:
        assert prefix_cache_thrashing(view, self.th) is why

    def test_says_what_it_lost(self) -> None:
        reasons = prefix_cache_thrashing(PrefixCacheView(0.6, 0.8, 1000.0, 200.0), self.th)
        assert reasons is not None
        assert "served 60% of prompt tokens over the last 60 s" in reasons[0]
        assert "80% it reached in the last 600 s" in reasons[0]
        assert "200 prompt tokens/s computed again" in reasons[1]
        off = Thresholds(prefix_hit_drop=0)
        assert prefix_cache_thrashing(PrefixCacheView(0.0, 0.8, 1000.0, 800.0), off) is None


def test_the_judge_holds_it_and_clears_it_after_the_exit_time() -> None:
    th = Thresholds(exit_after_s=15)
    judge = EngineJudge("http://vllm", ("m", "0"), th, 0)
    shares = [0.8] * 200 + [0.1] * 60 + [0.8] * 120
    since = []
    for t, o in enumerate(_feed(shares)):
        judge.observe(float(t), 1000.0 + t, o, None)
        since.append(judge.prefix_thrashing_since)
    first = next(i for i, s in enumerate(since) if s is not None)
    # the minute's share falls to 0.75 x 0.8 once 17 s of the drop are in it
    assert 216 <= first <= 219
    assert since[259] == 1000.0 + first and judge.prefix_reasons == ()  # cleared at the end
    cleared = next(i for i in range(first, len(since)) if since[i] is None)
    # back above 0.6 once under 17 s of the drop are left in the minute (about 303), then
    # exit_after_s
    assert 303 + 15 - 2 <= cleared <= 303 + 15 + 2
    signals = judge.signals
    assert signals is not None and signals.prompt_cache_hit_reference == pytest.approx(0.8)


def test_idle_windows_are_no_share_even_with_no_minimum_traffic() -> None:
    th = Thresholds(prefix_min_prompt_tokens_per_s=0)
    tl = _timeline([0.5] * 100, tokens_per_s=0.0)
    v = prefix_cache_view(tl, 99.0, th, hit_share=None, prompt_tokens_per_s=0.0)
    assert v.reference_share is None
