"""Stalls read beside the server's preemption counter."""

from __future__ import annotations

from kvwatch.loadgen.results.stall_causes import PreemptionCounter, mark_preempting_stalls

# the counter, sampled once a second from unix time 1000: flat, then it rises at 1003-1004
COUNTER = PreemptionCounter([(1000.0 + i, v) for i, v in enumerate([5, 5, 5, 5, 7, 7, 7, 7])])


def test_rose_needs_samples_around_the_span() -> None:
    assert COUNTER.rose(1000.5, 1002.5) is False  # flat all along
    assert COUNTER.rose(1002.5, 1003.2) is True  # rose by the first sample after the end
    assert COUNTER.rose(1004.5, 1006.0) is False  # after the rise
    assert COUNTER.rose(999.0, 1001.0) is None  # no sample before the stall began
    assert COUNTER.rose(1006.5, 1007.5) is None  # none after it ended
    assert COUNTER.rose(1007.0, 1007.0) is False  # samples at the very edges count
    # the update trails the resumed token: a sample 0.05 s after it may not show it yet
    trailing = PreemptionCounter([(0.0, 0.0), (1.05, 0.0), (2.0, 1.0)])
    assert trailing.rose(0.5, 1.0) is False and trailing.rose(0.5, 1.0, lag_s=0.2) is True
    # a stall that ended just before the last sample (the snapshot after the run): judged by it
    assert COUNTER.rose(1002.5, 1006.9, lag_s=0.2) is True
    assert COUNTER.rose(1002.5, 1007.1, lag_s=0.2) is None


def test_a_restart_is_a_rise_only_if_it_climbed_again() -> None:
    restarted = PreemptionCounter([(0.0, 9.0), (1.0, 0.0), (2.0, 0.0), (3.0, 2.0)])
    assert restarted.rose(0.5, 1.5) is False  # dropped to 0: a restart, no preemption
    assert restarted.rose(0.5, 2.5) is True
    assert PreemptionCounter([(0.0, 9.0), (1.0, 3.0)]).rose(0.0, 1.0) is True


def test_from_rows_skips_rows_without_the_counter() -> None:
    rows = [{"t": 3.0, "preemptions_total": 1}, {"t": 1.0, "preemptions_total": 0}, {"t": 2.0}]
    c = PreemptionCounter.from_rows(rows)
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
