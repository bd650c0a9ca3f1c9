"""A live server's counters as calibration figures (timing/server_slices.py): readings cut into
slices, slices left out with a counted reason, slices of one load pooled, and hidden constants
given back through the whole path. The live proof: tests/timing/test_calibrate_live.py and
bench/bench_calibrate.py cpu-metrics."""

from __future__ import annotations

import pytest

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.calibration import calibrate
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.server_slices import (
    MIN_GAPS,
    Reading,
    Slice,
    figures_from_slices,
    slices_from_readings,
)
from kvwatch.timing.steptime import StepConstants, StepModel

LLAMA = lookup_model("llama-3.1-8b")
H100 = lookup_gpu("h100")


def _reading(t: float, held: float = 4.0, gaps: float = 0.0, **kw: float | None) -> Reading:
    values: dict[str, float | None] = dict(
        itl_sum=gaps * 0.02, itl_count=gaps, prompt_sum=t * 100, prompt_count=t,
        output_sum=t * 50, output_count=t, preemptions=0.0,
    )  # fmt: skip
    values.update(kw)
    return Reading(t=t, held=held, **values)  # type: ignore[arg-type]


def _slice(held: float = 4, gaps: float = 400, itl: float = 0.02, p: float = 512, o: float = 128,
           n: float = 3, preempt: float = 0, start: float = 0) -> Slice:  # fmt: skip
    return Slice(start, start + 10, held, gaps * itl, gaps, p * n, n, o * n, n, preempt)


def test_readings_become_slices_of_the_asked_length_with_the_mean_requests_held() -> None:
    readings = [_reading(t, held=t % 3, gaps=10 * t) for t in range(31)]
    slices, skipped = slices_from_readings(readings, 10)
    assert skipped == []
    assert [(s.start, s.end) for s in slices] == [(0, 10), (10, 20), (20, 30)]
    assert slices[0].itl_count == 100
    assert slices[0].itl_sum == pytest.approx(2.0)
    assert slices[0].prompt_count == 10 and slices[0].prompt_sum == 1000
    assert slices[0].held == pytest.approx(sum(t % 3 for t in range(11)) / 11)
    # the halves' means: t 0-5 and 6-10
    assert slices[0].held_first == pytest.approx(sum(t % 3 for t in range(6)) / 6)
    assert slices[0].held_second == pytest.approx(sum(t % 3 for t in range(6, 11)) / 5)


def test_a_restart_and_a_missing_family_leave_their_slice_out_with_why() -> None:
    readings = [_reading(t, gaps=10 * t) for t in range(21)]
    readings[12] = _reading(12, gaps=1)  # a restart inside a slice: its counters fell
    slices, skipped = slices_from_readings(readings, 5)
    assert [s.start for s in slices] == [0, 5, 15] and len(skipped) == 1
    assert all("a counter fell" in s for s in skipped)
    bare = [_reading(t, itl_sum=None, itl_count=None) for t in range(11)]
    slices, skipped = slices_from_readings(bare, 5)
    assert slices == [] and "inter-token latency histogram" in skipped[0]


def test_slices_left_out_are_counted_by_reason_and_one_load_is_pooled() -> None:
    slices = [
        _slice(itl=0.020, gaps=400),
        _slice(itl=0.030, gaps=200),  # the same load: pooled, weighted by gaps
        _slice(held=16, itl=0.05),
        _slice(preempt=2),
        _slice(preempt=1),
        _slice(held=0.05),
        _slice(held=0.3, p=64, o=32),  # one stream of short requests, in the engine 30%
        _slice(gaps=MIN_GAPS - 1),
        _slice(held=float("nan")),
        Slice(0, 10, 8, 8, 400, 512, 1, 128, 1, 0, held_first=13, held_second=3),  # drain
        Slice(0, 10, 8, 8, 400, 512, 1, 128, 1, 0, held_first=7, held_second=9),  # steady
    ]
    figures, skipped = figures_from_slices(slices, 8192, 256)
    assert len(figures) == 4
    one = next(f for f in figures if f.load.concurrency == 1)
    assert (one.load.input_len, one.load.output_len) == (64, 32)
    four = next(f for f in figures if f.load.concurrency == 4)
    assert four.value == pytest.approx((400 * 0.02 + 200 * 0.03) / 600)
    assert (four.load.input_len, four.load.output_len) == (512, 128)
    assert "2 slices: 4 streams of 512 + 128 tokens" in four.label
    assert sorted(skipped) == sorted([
        "2 slices: preempted in it (recompute is in its gaps)",
        "1 slice: no request in the server",
        f"1 slice: fewer than {MIN_GAPS} token gaps",
        "1 slice: a value no server counts (negative, not a number, or past 1e18)",
        "1 slice: the load moved in it (50% more or fewer requests in its second half)",
    ])  # fmt: skip


def test_a_slice_without_finished_requests_takes_the_lengths_of_the_slices_around_it() -> None:
    """Its requests are the load's around it: the nearest slices with finished requests on
    both sides where they agree, the one side where only one has any; none at a boundary
    between two loads (the mean of the span gave a long-prompt load the span's short mean)."""
    long = _slice(p=3072, o=512, start=0)
    figures, skipped = figures_from_slices(
        [long, _slice(held=9, n=0, start=10), _slice(p=3072, o=512, start=20)], 8192, 256
    )
    nine = next(f for f in figures if f.load.concurrency == 9)
    assert (nine.load.input_len, nine.load.output_len) == (3072, 512)
    assert "lengths of the slices around" in nine.label and skipped == []
    figures, _ = figures_from_slices([_slice(held=9, n=0, start=0), long], 8192, 256)
    nine = next(f for f in figures if f.load.concurrency == 9)
    assert (nine.load.input_len, nine.load.output_len) == (3072, 512)
    figures, skipped = figures_from_slices(
        [long, _slice(held=9, n=0, start=10), _slice(start=20)], 8192, 256
    )
    assert not [f for f in figures if f.load.concurrency == 9]
    assert skipped == ["1 slice: no request finished in it, and the slices around it differ "
                       "(a load's boundary)"]  # fmt: skip
    figures, skipped = figures_from_slices([_slice(n=0)], 8192, 256)
    assert figures == [] and "lengths unknown" in skipped[0]


def test_hidden_constants_come_back_through_slices() -> None:
    """A server's slices made from hidden constants (each slice's gaps are what the step model
    says for its streams and lengths) calibrate back to them."""
    base = StepModel(LLAMA, H100)
    hidden = {
        "hbm_efficiency": base.hbm_efficiency * 1.2,
        "kv_efficiency": base.constants.kv_efficiency * 0.6,
        "mfu": base.mfu * 0.6,
    }
    truth = StepModel(LLAMA, H100, constants=StepConstants.with_overrides(hidden))
    slices = []
    for c in (1, 4, 16, 64, 128):
        for p, o in ((512, 256), (4096, 128), (16000, 64)):
            tpot = predict(truth, Load("fixed_concurrency", c, p, o, 8192, 1024), "tpot_s")
            slices.append(_slice(held=c, gaps=1000, itl=tpot, p=p, o=o))
    figures, skipped = figures_from_slices(slices, 8192, 1024)
    assert skipped == [] and len(figures) == 15
    cal = calibrate(LLAMA, H100, 1, "auto", figures, "slices")
    for k in ("hbm_efficiency", "kv_efficiency", "mfu"):
        assert cal.constants[k] == pytest.approx(hidden[k], rel=0.05), k


def test_calibrate_from_a_server_refuses_what_cannot_work_in_one_line() -> None:
    import subprocess
    import sys

    base = [sys.executable, "-m", "kvwatch", "calibrate", "--model", "llama-3.1-8b",
            "--gpu", "h100"]  # fmt: skip
    cases = [
        (["--prometheus", "http://127.0.0.1:9", "--window", "30d"], 2, "43,200 points"),
        (["--metrics", "http://127.0.0.1:9", "--watch", "15"], 2, "holds no two slices"),
        (["--sidecar", "http://127.0.0.1:9"], 3, "cannot read http://127.0.0.1:9/api/readings"),
        (["--metrics", "http://127.0.0.1:9", "--watch", "30"], 3, "cannot scrape"),
    ]
    for args, code, said in cases:
        p = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == code and said in p.stderr, (args, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) <= 2 and "Traceback" not in p.stderr
