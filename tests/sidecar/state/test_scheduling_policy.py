"""The sidecar knows the server's scheduling policy (the log's launch line, or its own flag) and
reads vLLM's preemption causes where a server exports them (`num_preemptions_by_reason`, in
either spelling): under priority scheduling, lower classes giving way is reported
(`kvwatch_policy_preemptions_per_second`) and judged pressure at most, not paged as saturation
or thrashing (docs/detection.md)."""

from __future__ import annotations

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sizing.levers import ServerInfo

_L = 'engine="0",model_name="m"'
LAUNCH = (
    "(APIServer pid=1) INFO 12-04 10:00:00 [api_utils.py:286] non-default args: {'port': 8000, "
    "'model': 'm', 'scheduling_policy': 'priority', 'max_model_len': 4096}"
)


def _body(pre: float, gen: float, finished: float, once: float, why: str = "") -> str:
    """A full cache, 30 waiting, 100 running: a preemption stream with repeat victims."""
    return (
        f"vllm:num_preemptions_total{{{_L}}} {pre}\n"
        f"vllm:generation_tokens_total{{{_L}}} {gen}\n"
        f"vllm:kv_cache_usage_perc{{{_L}}} 1.0\n"
        f"vllm:num_requests_running{{{_L}}} 100\n"
        f"vllm:num_requests_waiting{{{_L}}} 30\n"
        f'vllm:request_num_preemptions_bucket{{{_L},le="1.0"}} {once}\n'
        f'vllm:request_num_preemptions_bucket{{{_L},le="+Inf"}} {finished}\n'
        f"vllm:request_num_preemptions_count{{{_L}}} {finished}\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="8000"} 1\n' + why
    )


def _run(state: SidecarState, why: bool = False) -> tuple[str, list[str], float | None]:
    """Twenty scrapes a second apart: 2 preemptions/s, a repeat victim every other second,
    throughput steady. `why`: the server says they were all lower classes giving way."""
    for t in range(1, 21):
        reasons = (
            f'vllm:num_preemptions_by_reason_total{{{_L},reason="priority"}} {2 * t}\n'
            if why
            else ""
        )
        body = _body(2 * t, 4000 * t, 10 * t, 10 * t - t // 2, reasons)
        state.record_scrape("http://a", float(t), ScrapeOutcome(0.01, parse_exposition(body)))
    (eng,) = state.view(20.0).targets[0].engines
    assert eng.signals is not None
    return eng.state, list(eng.reasons), eng.signals.policy_preemptions_per_s


def _state(policy: str | None = None) -> SidecarState:
    return SidecarState(["http://a"], Thresholds(enter_after_s=1), scheduling_policy=policy)


def test_fcfs_pages_the_stream_as_thrashing() -> None:
    state, _, gave_way = _run(_state())
    assert state == "thrashing" and gave_way == 0


def test_the_policy_from_the_log_keeps_shedding_out_of_the_page() -> None:
    s = _state()
    s.record_log_lines([LAUNCH])
    state, reasons, gave_way = _run(s)
    assert state == "pressure"
    assert any("--scheduling-policy priority" in r for r in reasons)
    assert gave_way is not None and gave_way > 1.5  # the stream, 2/s, reported as the policy's
    view = s.view(20.0).targets[0]
    assert view.engines[0].signals is not None
    assert view.engines[0].signals.scheduling_policy == "priority"


def test_the_flag_stands_in_for_a_log_the_sidecar_does_not_read() -> None:
    assert _run(_state("priority"))[0] == "pressure"
    assert _run(_state("fcfs"))[0] == "thrashing"


def test_vllms_own_reason_decides_under_any_policy() -> None:
    state, reasons, gave_way = _run(_state(), why=True)
    assert state == "pressure" and any("vLLM says every one" in r for r in reasons)
    assert gave_way is not None and gave_way > 1.5


def test_both_spellings_of_the_reason_counter_are_read() -> None:
    for name in ("vllm:num_preemptions_by_reason_total", "vllm_num_preemptions_by_reason"):
        body = (
            f"vllm:num_preemptions_total{{{_L}}} 9\n"
            f'{name}{{{_L},reason="kv_full"}} 5\n'
            f'{name}{{{_L},reason="priority"}} 3\n'
            f'{name}{{{_L},reason="prefix_cache_reset"}} 1\n'
        )
        (obs,) = observe(parse_exposition(body)).values()
        assert (obs.preemptions_kv_full_total, obs.preemptions_priority_total) == (5, 3), name
    # a server that has counted only one reason so far: the other is 0, not unknown
    only = f'vllm:num_preemptions_by_reason_total{{{_L},reason="priority"}} 3\n'
    (obs,) = observe(parse_exposition(f"vllm:num_preemptions_total{{{_L}}} 3\n" + only)).values()
    assert (obs.preemptions_kv_full_total, obs.preemptions_priority_total) == (0, 3)
    # a server without the family: unknown
    (obs,) = observe(parse_exposition(f"vllm:num_preemptions_total{{{_L}}} 3\n")).values()
    assert obs.preemptions_kv_full_total is None and obs.preemptions_priority_total is None


def test_the_policy_is_read_from_the_launch_line_in_any_spelling() -> None:
    enum = "<SchedulerPolicy.PRIORITY: 'priority'>"
    spellings = (("'priority'", "priority"), ("'fcfs'", "fcfs"), (enum, "priority"),
                 ("'other'", None))  # fmt: skip
    for raw, want in spellings:
        assert ServerInfo(args=(("scheduling_policy", raw),)).scheduling_policy == want
    assert ServerInfo().scheduling_policy is None
