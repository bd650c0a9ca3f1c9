"""A live server's counters as calibration figures (timing/server_slices.py): readings cut into
slices, slices left out with a counted reason, slices of one load pooled, and hidden constants
given back through the whole path. The live proof: tests/timing/test_calibrate_live.py and
bench/bench_calibrate.py cpu-metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.calibration import SERVER_ROBUST, calibrate
from kvwatch.timing.loadmodel import decode_step_s
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.server_slices import (
    MAX_SPAN_SLICES,
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


def _hidden(hbm: float, kv: float, mfu: float) -> tuple[dict[str, float], StepModel]:
    """The shipped constants moved by these factors, and the step model that runs on them."""
    base = StepModel(LLAMA, H100)
    hidden = {
        "hbm_efficiency": base.hbm_efficiency * hbm,
        "kv_efficiency": base.constants.kv_efficiency * kv,
        "mfu": base.mfu * mfu,
    }
    return hidden, StepModel(LLAMA, H100, constants=StepConstants.with_overrides(hidden))


def test_hidden_constants_come_back_through_slices() -> None:
    """A server's slices made from hidden constants (each slice's gaps are what the step model
    says for its streams and lengths) calibrate back to them."""
    hidden, truth = _hidden(1.2, 0.6, 0.6)
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


def _engine_readings(
    truth: StepModel, loads: list[tuple[int, int, int]], budget: int = 8192, every: float = 0.05,
    seconds: float = 20.0,
) -> list[Reading]:  # fmt: skip
    """Closed loops of C streams of P + O tokens, one after another, stepped as vLLM steps them
    (decodes first, then prompt chunks in the token budget; streams started together stay in
    step, so a wave's prompts are prefilled together), each step as long as `truth` says; the
    counters read every `every` seconds, as a server's /metrics would give them."""
    from kvwatch.timing.steptime import ScheduledRequest

    n = dict.fromkeys(("steps", "gen", "computed", "itl_sum", "itl_count", "ttft_sum",
                       "ttft_count", "p_sum", "p_count", "o_sum", "o_count"), 0.0)  # fmt: skip
    out: list[Reading] = []
    t = 0.0

    def read(held: float) -> None:
        out.append(Reading(t, held, n["itl_sum"], n["itl_count"], n["p_sum"], n["p_count"],
                           n["o_sum"], n["o_count"], 0.0, n["ttft_sum"], n["ttft_count"],
                           n["steps"], n["computed"], n["gen"]))  # fmt: skip

    for c, p, o in loads:
        # per stream: prompt tokens left, tokens generated, its prompt's arrival, last token
        streams = [[p, 0, t, t] for _ in range(c)]
        end, next_read = t + seconds, t
        while t < end:
            batch, room, done = [], budget, []
            for s in streams:
                if s[0] == 0:
                    batch.append(ScheduledRequest(1, p + s[1]))
                    room -= 1
            for s in streams:
                if s[0] > 0 and room > 0:
                    chunk = min(s[0], room)
                    batch.append(ScheduledRequest(chunk, p - s[0] + chunk))
                    room -= chunk
                    done.append((s, chunk))
            t += truth.seconds(batch)
            n["steps"] += 1
            for s in streams:
                if s[0] == 0:
                    s[1] += 1
                    n["gen"] += 1
                    n["itl_sum"] += t - s[3]
                    n["itl_count"] += 1
                    s[3] = t
                    if s[1] == o:  # finished: its stream sends the next prompt
                        for k, v in (("p", p), ("o", o)):
                            n[f"{k}_sum"] += v
                            n[f"{k}_count"] += 1
                        s[:] = [p, 0, t, t]
            for s, chunk in done:
                s[0] -= chunk
                if s[0] == 0:  # its first token
                    s[1], s[3] = 1, t
                    n["gen"] += 1
                    n["computed"] += p
                    n["ttft_sum"] += t - s[2]
                    n["ttft_count"] += 1
            while next_read <= t:
                read(c)
                next_read += every
        for _ in range(round(1.0 / every)):  # the loop drains: a second empty between loads
            read(0)
            t += every
    return out


def test_busy_spans_give_hidden_constants_back_where_a_steady_loop_cannot() -> None:
    """A closed loop's prompts come in waves; a half-second slice holds a wave's decodes or its
    prefills, not their mean. Predicted from their own mix (steps, tokens, prompt tokens), the
    server's spans give the hidden constants back within 5%; the same readings without the
    step count (a server that exports none) go through the steady-loop figures, which read
    them as whole loops at each slice's requests held and miss."""
    hidden, truth = _hidden(0.8, 1.4, 1.4)
    loads = [(1, 512, 128), (8, 512, 128), (32, 512, 128), (64, 512, 128), (8, 3072, 128),
             (16, 3072, 512)]  # fmt: skip
    readings = _engine_readings(truth, loads)
    slices, _ = slices_from_readings(readings, 0.5)
    figures, skipped = figures_from_slices(slices, 8192, 1024)
    assert figures and all(f.metric == "step_s" and f.load.kind == "busy_span" for f in figures)
    assert any("empty" in s for s in skipped)  # the drains between loads
    cal = calibrate(LLAMA, H100, 1, "auto", figures, "slices", robust=SERVER_ROBUST)
    for k in ("hbm_efficiency", "kv_efficiency", "mfu"):
        assert cal.constants[k] == pytest.approx(hidden[k], rel=0.05), k
    blind = [replace(r, steps=None) for r in readings]
    slices, _ = slices_from_readings(blind, 0.5)
    figures, _ = figures_from_slices(slices, 8192, 1024)
    assert figures and all(f.load.kind == "fixed_concurrency" for f in figures)
    cal = calibrate(LLAMA, H100, 1, "auto", figures, "slices", robust=SERVER_ROBUST)
    assert max(abs(cal.constants[k] / v - 1) for k, v in hidden.items()) > 0.1


def _busy(start: float, held: float = 8, steps: float = 100, **kw: float) -> Slice:
    values = dict(itl_sum=10.0, itl_count=800, prompt_sum=512 * 4, prompt_count=4,
                  output_sum=128 * 4, output_count=4, preemptions=0, ttft_count=4,
                  steps=steps, prompt_computed=2048, generated=800, empty_share=0.0)  # fmt: skip
    values.update(kw)
    return Slice(start, start + 1, held, **values)  # type: ignore[arg-type]


def test_a_busy_span_ends_where_the_server_idled_preempted_or_the_lengths_changed() -> None:
    slices = [_busy(0), _busy(1), _busy(2, empty_share=0.6), _busy(3), _busy(4, preemptions=1),
              _busy(5), _busy(6, held=20, empty_share=0.2), _busy(7, prompt_sum=3072 * 4),
              _busy(9), _busy(11, steps=30), _busy(12, empty_share=None)]  # fmt: skip
    figures, skipped = figures_from_slices(slices, 8192, 256)
    spans = sorted(f.load.steps for f in figures)
    # 0-1 pooled; 3 alone; 5-6 pooled (the requests held are the span's own mix); 7 has other
    # lengths; 9 and 11 are not one span (a second between them) and 11 is too short alone;
    # 12's share of empty readings is not known (a Prometheus slice whose least was 0)
    assert spans == [100, 100, 100, 200, 200]
    assert sum("empty" in s for s in skipped) == 1 and "2 slices" in skipped[0]
    assert any("preempted" in s for s in skipped)
    assert any("fewer than 50 engine steps" in s for s in skipped)
    pooled = next(f for f in figures if f.load.steps == 200 and f.load.concurrency == 8)
    assert pooled.value == pytest.approx(2 / 200)
    assert pooled.load.generated == 1600 and pooled.load.prefill_tokens == 4096
    assert pooled.load.prefills == 8
    idled = next(f for f in figures if f.load.steps == 200 and f != pooled)
    assert idled.value == pytest.approx((1 + 0.8) / 200)  # the idle share is not steps
    # a busy slice in which no step ended is inside a long step: it stays in its span
    inside = [_busy(0), _busy(1, steps=0, generated=0, prompt_computed=0, ttft_count=0,
                            prompt_count=0, output_count=0), _busy(2)]  # fmt: skip
    (span,) = figures_from_slices(inside, 8192, 256)[0]
    assert span.load.steps == 200 and span.value == pytest.approx(3 / 200)
    long = [_busy(i) for i in range(MAX_SPAN_SLICES + 5)]
    assert [f.load.steps for f in figures_from_slices(long, 8192, 256)[0]] == [
        100 * MAX_SPAN_SLICES,
        500,
    ]


def test_a_busy_spans_step_is_its_decodes_with_its_prompts_computed_beside() -> None:
    steps = StepModel(LLAMA, H100)
    decodes = Load("busy_span", 8, 512, 128, 8192, 256, steps=100, generated=800)
    assert predict(steps, decodes, "step_s") == pytest.approx(decode_step_s(steps, 8, 512, 128))
    half = Load("busy_span", 8, 512, 128, 8192, 256, steps=100, generated=850)
    between = (decode_step_s(steps, 8, 512, 128) + decode_step_s(steps, 9, 512, 128)) / 2
    assert predict(steps, half, "step_s") == pytest.approx(between)
    prompts = replace(decodes, prefill_tokens=8 * 512, prefills=8)
    assert predict(steps, prompts, "step_s") > predict(steps, decodes, "step_s")
    with pytest.raises(SizingError):
        Load("busy_span", 8, 512, 128, 8192, 256, steps=0, generated=800)
    with pytest.raises(SizingError):
        predict(steps, decodes, "tpot_s")
