from __future__ import annotations

from pathlib import Path

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds, parse_overrides
from kvwatch.sidecar.judge.detect import Detector, Evidence, judge, policy_preemption_rate
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sidecar.store.episode_store import EpisodeStore

TH = Thresholds()


def ev(**kw: float | str | None) -> Evidence:
    base: dict[str, float | str | None] = dict(
        kv_usage=0.5, peak_kv_short=0.5, waiting=0, peak_waiting_recent=0, running=4,
        peak_running_long=4,
        preemptions_short=0, preemption_rate_short=0, repeat_preempted_long=0,
        generation_rate=100, peak_generation_rate_long=100,
    )  # fmt: skip
    base.update(kw)
    return Evidence(**base)  # type: ignore[arg-type]


class TestJudge:
    def test_levels(self) -> None:
        assert judge(ev(), TH)[0] is Level.OK
        assert judge(ev(kv_usage=0.92, peak_kv_short=0.92), TH)[0] is Level.PRESSURE
        assert judge(ev(kv_usage=0.9, peak_kv_short=1.0, waiting=5), TH)[0] is Level.SATURATED

    def test_thrashing_needs_a_stream_and_redone_work(self) -> None:
        full = dict(kv_usage=0.97, peak_kv_short=1.0, waiting=20)
        stream = dict(preemptions_short=20, preemption_rate_short=2.0)
        # a stream of preemptions with no sign of redone work: saturated only
        assert judge(ev(**full, **stream), TH)[0] is Level.SATURATED
        # collapse of the running batch while requests wait
        lvl, why = judge(ev(**full, **stream, running=4, peak_running_long=19), TH)
        assert lvl is Level.THRASHING and any("running fell to 4" in r for r in why)
        # repeat victims
        assert judge(ev(**full, **stream, repeat_preempted_long=3), TH)[0] is Level.THRASHING
        # throughput fell
        assert judge(ev(**full, **stream, generation_rate=50), TH)[0] is Level.THRASHING
        # one preemption is no stream
        one = dict(preemptions_short=1, preemption_rate_short=0.1, repeat_preempted_long=3)
        assert judge(ev(**full, **one), TH)[0] is Level.SATURATED
        # preemptions with nobody waiting are not thrashing
        assert judge(ev(**stream, repeat_preempted_long=3), TH)[0] is Level.OK

    def test_a_spike_the_samples_miss_is_still_seen(self) -> None:
        # A 5 s spike: KV sampled at 92% at most (the full moment fell between scrapes), and the
        # counter rose once the victims ran again, when nobody waits any more.
        spike = dict(kv_usage=0.6, peak_kv_short=0.92, waiting=0, peak_waiting_recent=5)
        stream = dict(preemptions_short=6, preemption_rate_short=0.6)
        lvl, why = judge(ev(**spike, **stream), TH)
        assert lvl is Level.SATURATED and "the cache ran out" in why[0]
        lvl, why = judge(ev(**spike, **stream, running=2, peak_running_long=8), TH)
        assert lvl is Level.THRASHING and any("running fell to 2" in r for r in why)
        # the same figures without a single preemption: only what the gauges say
        assert judge(ev(**spike), TH)[0] is Level.OK

    def test_refusals_at_the_queue_limit_count_as_waiting(self) -> None:
        # --max-num-queued-reqs keeps the queue short by refusing requests: a full cache that
        # turns requests away is saturated though almost nothing waits
        full = dict(kv_usage=0.99, peak_kv_short=1.0, waiting=0, peak_waiting_recent=0)
        assert judge(ev(**full), TH)[0] is Level.PRESSURE
        lvl, why = judge(ev(**full, rejected_short=12), TH)
        assert lvl is Level.SATURATED and "12 refused at the queue limit" in why[0]
        # refusals on a cache with room are a queue limit, not KV pressure
        assert judge(ev(rejected_short=12), TH)[0] is Level.OK

    def test_a_full_offload_tier_is_named(self) -> None:
        full = dict(kv_usage=0.97, peak_kv_short=1.0, waiting=20)
        stream = dict(preemptions_short=20, preemption_rate_short=2.0, repeat_preempted_long=3)
        lvl, why = judge(ev(**full, **stream, offload_failures_short=4), TH)
        assert lvl is Level.THRASHING and any("CPU offload tier full" in r for r in why)
        lvl, why = judge(ev(**full, offload_failures_short=4), TH)
        assert lvl is Level.SATURATED and "offload" in why[-1]
        assert not any("offload" in r for r in judge(ev(**full, **stream), TH)[1])

    def test_pressure_hysteresis_in_the_rule(self) -> None:
        assert judge(ev(kv_usage=0.87, peak_kv_short=0.87), TH)[0] is Level.OK
        assert judge(ev(kv_usage=0.87, peak_kv_short=0.87), TH, Level.PRESSURE)[0] is Level.PRESSURE


class TestDetector:
    def test_enter_after_and_exit_after(self) -> None:
        d = Detector(Thresholds(thrashing_enter_after_s=2, exit_after_s=5))
        assert not d.update(0, Level.THRASHING, ["x"])
        assert not d.update(1, Level.THRASHING, ["x"])
        assert d.update(2, Level.THRASHING, ["x"]) and d.level is Level.THRASHING
        for t in (3, 4, 5, 6):  # flapping raw judgements do not leave the state
            d.update(t, Level.SATURATED if t % 2 else Level.THRASHING, [])
        assert d.level is Level.THRASHING
        for t in range(7, 12):
            d.update(t, Level.OK, [])
        assert d.level is Level.THRASHING  # 7..11: not 5 s of calm yet at 11
        assert d.update(12, Level.OK, []) and d.level is Level.OK

    def test_a_blip_never_enters(self) -> None:
        d = Detector(Thresholds(enter_after_s=2, thrashing_enter_after_s=2))
        for t, raw in enumerate([Level.THRASHING, Level.OK, Level.THRASHING, Level.OK] * 5):
            d.update(float(t), raw, [])
        assert d.level is Level.OK
        d = Detector(Thresholds())  # defaults: a full-cache blip does not enter either
        for t, raw in enumerate([Level.SATURATED, Level.OK] * 5):
            d.update(float(t), raw, [])
        assert d.level is Level.OK

    def test_thrashing_enters_at_once_by_default(self) -> None:
        # its conditions already span the short window: no extra hold, so the alert is fast
        d = Detector(Thresholds(exit_after_s=5))
        assert not d.update(0, Level.SATURATED, [])
        assert d.update(1, Level.THRASHING, ["stream"]) and d.level is Level.THRASHING
        d.update(2, Level.OK, [])
        assert d.level is Level.THRASHING  # leaving still takes exit_after_s


class TestThresholds:
    def test_overrides(self) -> None:
        t = parse_overrides(["pressure_kv=0.8", "pressure_exit_kv=0.7"])
        assert t.pressure_kv == 0.8 and t.saturated_kv == TH.saturated_kv

    def test_bad_overrides(self) -> None:
        import pytest

        for bad in (["nope=1"], ["pressure_kv=x"], ["pressure_kv"], ["pressure_exit_kv=0.95"]):
            with pytest.raises(ValueError):
                parse_overrides(bad)


def _body(pre: float, gen: float, kv: float, running: int, waiting: int) -> str:
    return (
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {pre}\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="40"} 1\n'
    )


class TestStateEpisodes:
    def test_episode_recorded_and_kept_across_restart(self, tmp_path: Path) -> None:
        db = tmp_path / "ep.db"
        th = Thresholds(enter_after_s=1, exit_after_s=3)
        st = SidecarState(["http://a"], th, EpisodeStore(db))
        t, pre, gen = 0.0, 0.0, 0.0
        script = [(0, 100, 0.3, 4, 0)] * 3 + [(2, 20, 1.0, 4, 20)] * 8 + [(0, 100, 0.2, 3, 0)] * 10
        running_peak = [(0, 100, 0.9, 19, 5)]
        for d_pre, d_gen, kv, run, wait in running_peak + script:
            pre, gen, t = pre + d_pre, gen + d_gen, t + 1
            exp = parse_exposition(_body(pre, gen, kv, run, wait))
            st.record_scrape("http://a", t, ScrapeOutcome(0.01, exp))
        view = st.view(t)
        (eng,) = view.targets[0].engines
        assert eng.state == "ok" and eng.episodes == 1
        assert "thrashing" in [x.to_state for x in view.transitions]
        (ep,) = st.episodes()
        assert ep.end_unix is not None and ep.closed_by == "recovered"
        assert ep.preemptions >= 10 and ep.peak_kv == 1.0 and ep.tokens_recomputed > 0
        st.store.close()
        st2 = SidecarState(["http://a"], th, EpisodeStore(db))
        st2.record_scrape(
            "http://a", 1.0, ScrapeOutcome(0.01, parse_exposition(_body(0, 0, 0, 0, 0)))
        )
        assert st2.view(1.0).targets[0].engines[0].episodes == 1


def test_victims_a_tenth_of_the_finished_are_redone_work_at_scale() -> None:
    """At H100 scale a preemption stream leaves the batch and the throughput where they were;
    victims that are 10% of the requests finishing are the sign (docs/detection.md)."""
    big = dict(kv_usage=1.0, peak_kv_short=1.0, waiting=5, running=100, peak_running_long=103,
               generation_rate=4200.0, peak_generation_rate_long=4660.0)  # fmt: skip
    stream = dict(preemptions_short=7, preemption_rate_short=0.7)
    lvl, why = judge(ev(**big, **stream, finished_short=68), TH)
    assert lvl is Level.THRASHING and any("7 preempted against 68 finished" in r for r in why)
    assert judge(ev(**big, **stream, finished_short=71), TH)[0] is Level.SATURATED
    assert judge(ev(**big, **stream), TH)[0] is Level.SATURATED  # no finished count: no sign
    off = Thresholds(thrashing_preempted_share=0)
    assert judge(ev(**big, **stream, finished_short=68), off)[0] is Level.SATURATED


class TestPriorityPolicy:
    """Under --scheduling-policy priority the lowest class giving way is the policy at work:
    judged pressure at most and reported (kvwatch_policy_preemption_rate_per_second), not paged."""

    big = dict(kv_usage=1.0, peak_kv_short=1.0, waiting=30, running=72, peak_running_long=127,
               generation_rate=1400.0, peak_generation_rate_long=8000.0,
               preemptions_short=20, preemption_rate_short=2.0, finished_short=60,
               repeat_preempted_long=5)  # fmt: skip

    def test_where_vllm_does_not_say_why_every_preemption_is_the_policys(self) -> None:
        lvl, why = judge(ev(**self.big), TH)
        assert lvl is Level.THRASHING  # fcfs: every sign, the page
        e = ev(**self.big, scheduling_policy="priority")
        lvl, why = judge(e, TH)
        assert lvl is Level.PRESSURE
        assert any("--scheduling-policy priority" in r and "not paged" in r for r in why)
        assert policy_preemption_rate(e) == 2.0 and policy_preemption_rate(ev(**self.big)) == 0
        # a full cache with requests waiting and no preemption is saturation, policy or not
        calm = self.big | dict(preemptions_short=0, preemption_rate_short=0.0)
        assert judge(ev(**calm, scheduling_policy="priority"), TH)[0] is Level.SATURATED

    def test_vllms_own_reasons_decide_where_it_gives_them(self) -> None:
        # all 20 were lower classes giving way: reported, under any policy the sidecar assumed
        gave_way = dict(kv_full_preemptions_short=0, kv_full_rate_short=0.0,
                        priority_preemptions_short=20, priority_rate_short=2.0)  # fmt: skip
        for policy in (None, "priority"):
            e = ev(**self.big, **gave_way, scheduling_policy=policy)
            lvl, why = judge(e, TH)
            assert lvl is Level.PRESSURE and any("vLLM says every one" in r for r in why)
            assert policy_preemption_rate(e) == 2.0
        # 16 found no block: the cache is short, paged as thrashing, the 4 reported beside
        short = dict(kv_full_preemptions_short=16, kv_full_rate_short=1.6,
                     priority_preemptions_short=4, priority_rate_short=0.4)  # fmt: skip
        e = ev(**self.big, **short, scheduling_policy="priority")
        lvl, why = judge(e, TH)
        assert lvl is Level.THRASHING and why[0].startswith("1.6 preemptions/s (16 in")
        assert any("4 more preemptions in the short window were lower-priority" in r for r in why)
        assert policy_preemption_rate(e) == 0.4
