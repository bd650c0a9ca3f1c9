"""Stall seconds by cause from the ITL histogram: the line, straddled buckets, restarts, a
twin's clock, a preemption that began a gap scrapes earlier, and a broken histogram."""

from __future__ import annotations

import math

import pytest

from kvwatch.sidecar.judge.stall_seconds import Rise, StallTally, StallWindow, window_stalls

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
NOW = (100.0, 101.0)  # the window's scrapes


def causes(got: StallWindow | None) -> dict[str, float]:
    assert got is not None
    return {c: round(n.stalls, 6) for c, n in got.by_cause.items()}


def test_gaps_far_above_the_median_are_stalls_counted_at_their_bucket_middle() -> None:
    got = window_stalls(EMPTY, hist({0.025: 200, 2.5: 3, 0.05: 10}), 0)
    assert got is not None
    assert got.stalls == pytest.approx(3)
    assert got.seconds == pytest.approx(3 * (1.0 + 2.5) / 2)
    assert causes(got) == {"other": 3}


@pytest.mark.parametrize(
    ("rise", "computed", "want"),
    [
        ((99.9, 100.5, 4), 5000, {"preemption": 4}),  # scraped across the window's start
        ((99.2, 100.0, 4), 0, {"preemption": 4}),  # 1-2.5 s gaps ending now began then
        ((99.9, 100.5, 1), 5000, {"preemption": 1, "prefill": 3}),  # one victim a preemption
        ((96.0, 97.0, 4), 5000, {"prefill": 4}),  # too early for any gap of this window
        ((100.0, 101.0, 4), 0, {"preemption": 4}),  # counted at the resume (no async scheduling)
        ((101.0, 102.0, 4), 0, {"other": 4}),  # after the gaps ended
        (None, 5000, {"prefill": 4}),
        (None, 0, {"other": 4}),
    ],
)
def test_a_gap_is_a_victims_where_it_could_hold_an_unclaimed_preemption(
    rise: tuple[float, float, float] | None, computed: float, want: dict[str, float]
) -> None:
    rises = [] if rise is None else [Rise(*rise)]
    got = window_stalls(EMPTY, hist({0.025: 100, 2.5: 4}), computed, rises=rises, window=NOW)
    assert causes(got) == want


def test_the_longest_gaps_claim_the_victims_and_a_claimed_rise_is_spent() -> None:
    rises = [Rise(99.5, 100.0, 1)]
    got = window_stalls(EMPTY, hist({0.025: 100, 0.5: 3, 2.5: 1}), 0, rises=rises, window=NOW)
    assert got is not None
    assert got.by_cause["preemption"].seconds == pytest.approx(1.75)  # the 1-2.5 s gap
    assert got.by_cause["other"].stalls == pytest.approx(3)
    assert rises[0].left == 0
    again = window_stalls(EMPTY, hist({0.025: 100, 2.5: 1}), 0, rises=rises, window=NOW)
    assert causes(again) == {"other": 1}


def test_a_long_gap_looks_further_back() -> None:
    # a 10-20 s gap that ended now began at most 20 s before the window's start
    got = window_stalls(EMPTY, hist({0.025: 100, 20.0: 1}), 0, rises=[Rise(85.0, 86.0, 1)],
                        window=NOW)  # fmt: skip
    assert causes(got) == {"preemption": 1}
    got = window_stalls(EMPTY, hist({0.025: 100, 2.5: 1}), 0, rises=[Rise(85.0, 86.0, 1)],
                        window=NOW)  # fmt: skip
    assert causes(got) == {"other": 1}


def test_prompts_computed_while_a_gap_lasted_make_it_prefill() -> None:
    # vLLM counts a prompt with its first token, at the end of the step that held the others
    # up; that can land a scrape before the gaps it caused do
    earlier = [(98.0, 99.0)]
    got = window_stalls(EMPTY, hist({0.025: 100, 2.5: 2}), 0, window=NOW, prefills=earlier)
    assert causes(got) == {"prefill": 2}  # 1-2.5 s gaps ending in (100, 101] began after 97.5
    got = window_stalls(EMPTY, hist({0.025: 100, 0.75: 2}), 0, window=NOW, prefills=earlier)
    assert causes(got) == {"other": 2}  # 0.5-0.75 s gaps began after 99.25: not then


def test_the_tally_remembers_the_windows_with_prompts() -> None:
    t = StallTally()
    step = {"preemptions_total": 0.0, "prompt_tokens_computed_total": 0.0}
    t.add(0.0, hist({0.025: 100}), step)
    t.add(1.0, hist({0.025: 200}), {**step, "prompt_tokens_computed_total": 12_000})
    t.add(2.0, hist({0.025: 300, 2.5: 30}), step)  # the prompt's stalls, a scrape later
    t.add(199.0, hist({0.025: 400, 2.5: 30}), step)
    t.add(200.0, hist({0.025: 500, 2.5: 31}), step)  # long after: not that prompt's
    assert t.counts["prefill"].stalls == pytest.approx(30)
    assert t.counts["other"].stalls == pytest.approx(1)


def test_a_bucket_across_the_line_counts_its_share_above_it() -> None:
    # median 0.025 -> line max(5 x 0.025, 0.25) = 0.25, inside (0.2, 0.3]: half of it counts
    got = window_stalls(EMPTY, hist({0.025: 100, 0.3: 10}), 0)
    assert got is not None
    assert got.stalls == pytest.approx(5)
    assert got.seconds == pytest.approx(5 * 0.275)


def test_the_line_follows_a_slow_median() -> None:
    # every gap 0.3-0.4 s: the median's bound 0.4 puts the line at 2 s; 1 s gaps are no stall
    assert window_stalls(EMPTY, hist({0.4: 100, 1.0: 5}), 0) is None
    got = window_stalls(EMPTY, hist({0.4: 100, 5.0: 5}), 0)
    assert got is not None and got.stalls == pytest.approx(5)


def test_gaps_past_the_last_bound_count_as_that_bound() -> None:
    got = window_stalls(EMPTY, hist({0.025: 100, math.inf: 2}), 0)
    assert got is not None and got.seconds == pytest.approx(2 * 80.0)


def test_a_twins_gaps_are_judged_on_its_clock() -> None:
    # at time scale 2 the 0.3-0.4 s wall gaps are 0.15-0.2 s of the card's: under the line
    before = hist({0.025: 100})
    assert window_stalls(before, hist({0.025: 300, 0.4: 5}), 0, scale=2.0) is None
    got = window_stalls(before, hist({0.025: 300, 2.5: 2}), 0, scale=2.0)
    assert got is not None and got.seconds == pytest.approx(2 * (0.5 + 1.25) / 2)


def test_only_the_gaps_since_the_last_scrape_count() -> None:
    got = window_stalls(hist({0.025: 100, 2.5: 3}), hist({0.025: 200, 2.5: 4}), 0)
    assert got is not None and got.stalls == pytest.approx(1)


def test_a_restart_counts_from_zero_and_other_bounds_are_a_restart() -> None:
    before = hist({0.025: 1000, 2.5: 30})
    got = window_stalls(before, hist({0.025: 50, 2.5: 2}), 0)  # the total fell: a restart
    assert got is not None and got.stalls == pytest.approx(2)
    custom = ((0.1, 50.0), (1.0, 50.0), (10.0, 52.0), (math.inf, 52.0))
    got = window_stalls(before, custom, 0)
    assert got is not None and got.stalls == pytest.approx(2)


def test_no_gap_in_the_window_is_no_window() -> None:
    h = hist({0.025: 100, 2.5: 3})
    assert window_stalls(h, h, 0, rises=[Rise(*NOW, 1)], window=NOW) is None


def test_the_tally_sums_by_cause_remembers_rises_and_counts_what_it_cannot_read() -> None:
    t = StallTally()
    step = {"preemptions_total": 0.0, "prompt_tokens_computed_total": 0.0}
    assert t.add(0.0, hist({0.025: 100, 2.5: 9}), step) is None  # the first scrape: history
    t.add(1.0, hist({0.025: 200, 2.5: 9}), {**step, "preemptions_total": 3})  # no gap yet
    # the victims' gaps land a scrape later: they began with that preemption
    t.add(2.0, hist({0.025: 300, 2.5: 10}), step)
    t.add(3.0, hist({0.025: 400, 2.5: 10}), step)  # no stall: nothing added
    t.add(4.0, hist({0.025: 500, 2.5: 10}), step)
    # 1-2.5 s gaps ending in (4, 5] began after 1.5: not with the preemption of (0, 1]
    t.add(5.0, hist({0.025: 600, 2.5: 12}), {**step, "prompt_tokens_computed_total": 900})
    t.add(6.0, hist({0.025: 700, 2.5: 13}), None)  # the timeline refused the point: skipped
    broken = ((0.1, 10.0), (1.0, 5.0), (math.inf, 20.0))  # cumulative counts that fall
    t.add(7.0, broken, step)
    t.add(8.0, ((0.1, 10.0), (1.0, math.nan), (math.inf, 20.0)), step)
    assert t.counts["preemption"].stalls == pytest.approx(1)
    assert t.counts["prefill"].stalls == pytest.approx(2)
    assert t.counts["other"].stalls == 0
    assert t.broken == 2
    assert t.total_seconds() == pytest.approx(3 * 1.75)


def test_a_server_without_the_histogram_adds_nothing() -> None:
    t = StallTally()
    for i in range(3):
        assert t.add(float(i), (), {"preemptions_total": 1.0}) is None
    assert t.total_seconds() == 0 and t.broken == 0 and not t.seen
