"""Stalls read beside the server's preemption counter."""

from __future__ import annotations

from kvwatch.loadgen.results.stall_causes import (
    SampledCounter,
    ServerCounters,
    attribute_stalls,
    mark_preempting_stalls,
    token_times,
)

# the counter, sampled once a second from unix time 1000: flat, then it rises at 1003-1004
COUNTER = SampledCounter([(1000.0 + i, v) for i, v in enumerate([5, 5, 5, 5, 7, 7, 7, 7])])


def test_rose_needs_samples_around_the_span() -> None:
    assert COUNTER.rose(1000.5, 1002.5) is False  # flat all along
    assert COUNTER.rose(1002.5, 1003.2) is True  # rose by the first sample after the end
    assert COUNTER.rose(1004.5, 1006.0) is False  # after the rise
    assert COUNTER.rose(999.0, 1001.0) is None  # no sample before the stall began
    assert COUNTER.rose(1006.5, 1007.5) is None  # none after it ended
    assert COUNTER.rose(1007.0, 1007.0) is False  # samples at the very edges count
    # the update trails the resumed token: a sample 0.05 s after it may not show it yet
    trailing = SampledCounter([(0.0, 0.0), (1.05, 0.0), (2.0, 1.0)])
    assert trailing.rose(0.5, 1.0) is False and trailing.rose(0.5, 1.0, lag_s=0.2) is True
    # a stall that ended just before the last sample (the snapshot after the run): judged by it
    assert COUNTER.rose(1002.5, 1006.9, lag_s=0.2) is True
    assert COUNTER.rose(1002.5, 1007.1, lag_s=0.2) is None


def test_a_restart_is_a_rise_only_if_it_climbed_again() -> None:
    restarted = SampledCounter([(0.0, 9.0), (1.0, 0.0), (2.0, 0.0), (3.0, 2.0)])
    assert restarted.rose(0.5, 1.5) is False  # dropped to 0: a restart, no preemption
    assert restarted.rose(0.5, 2.5) is True
    assert SampledCounter([(0.0, 9.0), (1.0, 3.0)]).rose(0.0, 1.0) is True


def test_from_rows_skips_rows_without_the_counter() -> None:
    rows = [{"t": 3.0, "preemptions_total": 1}, {"t": 1.0, "preemptions_total": 0}, {"t": 2.0}]
    c = SampledCounter.from_rows(rows)
    assert (c.times, c.values) == ([1.0, 3.0], [0.0, 1.0])


def test_mark_counts_each_records_preempting_stalls() -> None:
    records = [
        # stalls from 0.5 to 2.5 s (flat) and from 2.8 to 3.1 s (the counter rises at 3-4)
        {"stall_spans": [[0.5, 2.5], [2.8, 3.1]]},
        {"stall_spans": []},
        {"stall_spans": [[6.5, 7.5]]},  # the timeline ends at 7 s: cannot be judged
        {},  # a failed request has no spans
    ]
    mark_preempting_stalls(records, COUNTER, start_unix=1000.0, lag_s=0.2)
    assert [r["stalls_preempting"] for r in records] == [1, 0, None, 0]


# -- one cause per stall -------------------------------------------------------------------


def _stream(first: float, gaps: list[float], spans: list[list[float]] | None = None) -> dict:
    return {"first_token_at": first, "gaps": gaps, "stall_spans": spans or []}


def _rows(*points: tuple[float, float, float]) -> list[dict]:
    """Timeline rows (t, preemptions, prompt tokens computed), t from start 1000."""
    return [{"t": 1000 + t, "preemptions_total": p, "prompt_tokens_computed_total": c}
            for t, p, c in points]  # fmt: skip


STEADY = [0.05] * 80  # a stream with a token every 50 ms over 4 s


def test_a_stream_stalled_alone_is_the_victim_or_was_queued() -> None:
    victim = _stream(0.0, [0.05] * 20 + [1.5] + [0.05] * 20, [[1.0, 2.5]])
    others = [_stream(0.01 * i, STEADY) for i in range(4)]
    for rise, cause in ((1, "preempted"), (0, "queue")):
        recs = [dict(victim), *others]
        attribute_stalls(recs, ServerCounters(_rows((0, 0, 0), (2, rise, 0), (4, rise, 0))), 1000)
        assert recs[0]["stall_causes"] == [cause]
        assert all(r["stall_causes"] == [] for r in recs[1:])


def test_streams_stalled_together_name_the_step_that_held_them() -> None:
    """Everyone stopped for the same 0.8 s: a recompute when the counter rose, a prefill when
    prompt tokens were computed, else the host."""

    def together() -> list[dict]:
        return [_stream(0.01 * i, [0.05] * 20 + [0.8] + [0.05] * 20,
                        [[0.01 * i + 1.0, 0.01 * i + 1.8]]) for i in range(4)]  # fmt: skip

    for rows, cause in (
        (_rows((0, 5, 100), (3, 6, 100)), "recompute"),
        (_rows((0, 5, 100), (3, 5, 9000)), "prefill"),
        (_rows((0, 5, 100), (3, 5, 100)), "host"),
    ):
        recs = together()
        attribute_stalls(recs, ServerCounters(rows), 1000)
        assert [r["stall_causes"] for r in recs] == [[cause]] * 4


def test_a_shared_stall_beside_another_clients_requests_is_their_prefill() -> None:
    """A prompt prefilled in chunks is counted only with its last chunk: while the server held
    requests that were not this run's (another client's, queued or being prefilled) a shared
    stall with no counter's word is theirs; with only this run's requests, the host."""

    def together() -> list[dict]:
        return [{**_stream(0.01 * i, [0.05] * 20 + [0.8] + [0.05] * 20,
                           [[0.01 * i + 1.0, 0.01 * i + 1.8]]),
                 "sent_at": 0.0, "finished_at": 4.0} for i in range(4)]  # fmt: skip

    for held, cause in ((4, "host"), (6, "prefill")):
        rows = [{**r, "running": held - 1, "waiting": 1} for r in _rows((0, 5, 100), (3, 5, 100))]
        recs = together()
        attribute_stalls(recs, ServerCounters(rows), 1000)
        assert [r["stall_causes"] for r in recs] == [[cause]] * 4, held
    # another client's requests at only one of the samples around it: not throughout
    rows = [{**r, "running": n, "waiting": 0}
            for r, n in zip(_rows((0, 5, 100), (3, 5, 100)), (6, 4), strict=True)]  # fmt: skip
    recs = together()
    attribute_stalls(recs, ServerCounters(rows), 1000)
    assert recs[0]["stall_causes"] == ["host"]


def test_with_no_one_to_compare_with_the_counters_say_or_it_is_unknown() -> None:
    """The last turns of a session load stream alone: the counter that rose names it."""
    for rise, prompts, cause in ((1, 0, "preempted"), (0, 500, "prefill"), (0, 0, "unknown")):
        alone = [_stream(0.0, [0.05] * 20 + [1.5] + [0.05] * 20, [[1.0, 2.5]])]
        attribute_stalls(alone, ServerCounters(_rows((0, 0, 0), (4, rise, prompts))), 1000)
        assert alone[0]["stall_causes"] == [cause], (rise, prompts)
    recs = [_stream(0.0, [0.05] * 20 + [1.5] + [0.05] * 20, [[1.0, 2.5]]),
            _stream(0.0, STEADY)]  # fmt: skip
    attribute_stalls(recs, ServerCounters([]), 1000)  # no samples around it
    assert recs[0]["stall_causes"] == ["unknown"]


def test_prompt_tokens_fall_back_to_all_prompt_tokens() -> None:
    c = ServerCounters([{"t": 1.0, "prompt_tokens_total": 5}, {"t": 2.0, "prompt_tokens_total": 9}])
    assert c.prompt.rose(1.2, 1.5) is True


def test_token_times_rebuild_from_gaps() -> None:
    assert token_times({"first_token_at": 1.0, "gaps": [0.5, 0.25]}) == [1.0, 1.5, 1.75]
    assert token_times({"first_token_at": None, "gaps": [0.5]}) == []


def test_a_shared_stall_goes_to_the_bigger_of_the_recompute_and_the_new_prompts() -> None:
    """The step that ends a shared stall recomputes the victims that resume with it (their
    prompt and what they had made) and prefills the prompts whose first token comes with it."""

    def load(victim_prompt: int, new_prompt: int) -> list[dict]:
        held = [_stream(0.01 * i, [0.05] * 40 + [0.6] + [0.05] * 20,
                        [[0.01 * i + 2.0, 0.01 * i + 2.6]]) for i in range(4)]  # fmt: skip
        victim = _stream(0.0, [0.05] * 10 + [2.12] + [0.05] * 20, [[0.5, 2.62]])
        victim["prompt_tokens"] = victim_prompt
        newcomer = {"first_token_at": 2.63, "gaps": [0.05] * 5, "prompt_tokens": new_prompt}
        runner = _stream(0.0, [0.05] * 12)  # flows through the victim's stall, then ends
        return [victim, *held, newcomer, runner]

    rows = _rows((0, 0, 0), (1, 1, 0), (2, 1, 0), (3, 2, 4000), (4, 2, 4000))
    for victim_prompt, new_prompt, cause in ((3000, 500, "recompute"), (300, 2000, "prefill")):
        recs = load(victim_prompt, new_prompt)
        attribute_stalls(recs, ServerCounters(rows), 1000)
        assert recs[0]["stall_causes"] == ["preempted"]
        assert [r["stall_causes"] for r in recs[1:5]] == [[cause]] * 4, cause
