"""Stall seconds by cause from the ITL histogram: the line, straddled buckets, restarts, a
twin's clock and a broken histogram."""

from __future__ import annotations

import math

import pytest

from kvwatch.sidecar.judge.stall_seconds import StallTally, window_stalls

# vLLM's default inter-token latency bounds (vllm/v1/metrics/buckets.py)
BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
          10.0, 20.0, 40.0, 80.0, math.inf)  # fmt: skip


def hist(gaps: dict[float, float]) -> tuple[tuple[float, float], ...]:
    """Cumulative buckets from {upper bound: gaps in that bucket}."""
    total, out = 0.0, []
    for le in BOUNDS:
        total += gaps.get(le, 0.0)
        out.append((le, total))
    return tuple(out)


EMPTY = hist({})


def test_gaps_far_above_the_median_are_stalls_counted_at_their_bucket_middle() -> None:
    got = window_stalls(EMPTY, hist({0.025: 200, 2.5: 3, 0.05: 10}), 0, 0)
    assert got is not None
    assert got.stalls == pytest.approx(3)
    assert got.seconds == pytest.approx(3 * (1.0 + 2.5) / 2)
    assert got.cause == "other"


@pytest.mark.parametrize(
    ("preempted", "computed", "cause"),
    [(2, 5000, "preemption"), (0, 5000, "prefill"), (0, 0, "other")],
)
def test_the_window_is_the_cause(preempted: float, computed: float, cause: str) -> None:
    got = window_stalls(EMPTY, hist({0.025: 100, 1.0: 4}), preempted, computed)
    assert got is not None and got.cause == cause


def test_a_bucket_across_the_line_counts_its_share_above_it() -> None:
    # median 0.025 -> line max(5 x 0.025, 0.25) = 0.25, inside (0.2, 0.3]: half of it counts
    got = window_stalls(EMPTY, hist({0.025: 100, 0.3: 10}), 0, 0)
    assert got is not None
    assert got.stalls == pytest.approx(5)
    assert got.seconds == pytest.approx(5 * 0.275)


def test_the_line_follows_a_slow_median() -> None:
    # every gap 0.3-0.4 s: the median's bound 0.4 puts the line at 2 s; 1 s gaps are no stall
    assert window_stalls(EMPTY, hist({0.4: 100, 1.0: 5}), 0, 0) is None
    got = window_stalls(EMPTY, hist({0.4: 100, 5.0: 5}), 0, 0)
    assert got is not None and got.stalls == pytest.approx(5)


def test_gaps_past_the_last_bound_count_as_that_bound() -> None:
    got = window_stalls(EMPTY, hist({0.025: 100, math.inf: 2}), 1, 0)
    assert got is not None and got.seconds == pytest.approx(2 * 80.0)


def test_a_twins_gaps_are_judged_on_its_clock() -> None:
    # at time scale 2 the 0.3-0.4 s wall gaps are 0.15-0.2 s of the card's: under the line
    before = hist({0.025: 100})
    after = hist({0.025: 300, 0.4: 5})
    assert window_stalls(before, after, 0, 0, scale=2.0) is None
    got = window_stalls(before, hist({0.025: 300, 2.5: 2}), 0, 0, scale=2.0)
    assert got is not None and got.seconds == pytest.approx(2 * (0.5 + 1.25) / 2)


def test_only_the_gaps_since_the_last_scrape_count() -> None:
    before = hist({0.025: 100, 2.5: 3})
    after = hist({0.025: 200, 2.5: 4})
    got = window_stalls(before, after, 0, 0)
    assert got is not None and got.stalls == pytest.approx(1)


def test_a_restart_counts_from_zero_and_other_bounds_are_a_restart() -> None:
    before = hist({0.025: 1000, 2.5: 30})
    after = hist({0.025: 50, 2.5: 2})  # the total fell: vLLM restarted
    got = window_stalls(before, after, 0, 0)
    assert got is not None and got.stalls == pytest.approx(2)
    custom = ((0.1, 50.0), (1.0, 50.0), (10.0, 52.0), (math.inf, 52.0))
    got = window_stalls(before, custom, 0, 0)
    assert got is not None and got.stalls == pytest.approx(2)


def test_no_gap_in_the_window_is_no_window() -> None:
    h = hist({0.025: 100, 2.5: 3})
    assert window_stalls(h, h, 5, 0) is None


def test_the_tally_sums_by_cause_and_counts_what_it_cannot_read() -> None:
    t = StallTally()
    step = {"preemptions_total": 0.0, "prompt_tokens_computed_total": 0.0}
    assert t.add(hist({0.025: 100, 2.5: 9}), step) is None  # the first scrape: history
    t.add(hist({0.025: 200, 2.5: 10}), {**step, "preemptions_total": 3})
    t.add(hist({0.025: 300, 2.5: 12}), {**step, "prompt_tokens_computed_total": 900})
    t.add(hist({0.025: 400, 2.5: 12}), step)  # no stall: nothing added
    t.add(hist({0.025: 500, 2.5: 13}), None)  # the timeline refused the point: skipped
    broken = ((0.1, 10.0), (1.0, 5.0), (math.inf, 20.0))  # cumulative counts that fall
    t.add(broken, step)
    t.add(((0.1, 10.0), (1.0, math.nan), (math.inf, 20.0)), step)
    assert t.counts["preemption"].stalls == pytest.approx(1)
    assert t.counts["prefill"].stalls == pytest.approx(2)
    assert t.counts["other"].stalls == 0
    assert t.broken == 2
    assert t.total_seconds() == pytest.approx(3 * 1.75)


def test_a_server_without_the_histogram_adds_nothing() -> None:
    t = StallTally()
    for _ in range(3):
        assert t.add((), {"preemptions_total": 1.0}) is None
    assert t.total_seconds() == 0 and t.broken == 0
