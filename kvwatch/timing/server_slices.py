"""A live server's counters, read at two times, as loads the step model can be held to.

vLLM exports no step time, but between two readings of its `/metrics` (or two points of its
Prometheus history) the counters say what it did: the inter-token latency histogram's sum over
its count is the mean gap between a stream's tokens (the TPOT the step model predicts for N
streams, the prefills landing inside their decode included), and the time-to-first-token
histogram's the mean TTFT (a wave's prefill and its wait: what pins the cost of a prefill); the
requests it holds (the running and waiting gauges), averaged over the slice, are N; the finished
requests' prompt and output histograms give the lengths. A slice is left out, counted with why,
when it holds a preemption (recompute is in its gaps), a counter reset (a restart), a load that
moved inside it (the requests held differ by more than half between its halves: a closed loop's
start or drain, the next stage of a sweep), too few gaps to be a figure, or no request. Slices
of one load (the same streams, lengths within 5%) are pooled into one figure, weighted by their
gaps, so an hour of history is a few dozen figures, not hundreds.

A server that counts its engine steps (`vllm:iteration_tokens_total`) is read as busy spans
instead (`busy_span_figures`): runs of slices in which it was busy, each figure the span's
mean step, predicted from the span's own mix, not as a steady loop (a closed loop's slices
hold a wave's decodes or its prefills, not their mean; docs/twin.md). Pure: the readers live
in `kvwatch/advise/server_readings.py`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, fields

from kvwatch.timing.calibration import Figure
from kvwatch.timing.measured import Load

__all__ = ["Reading", "Slice", "slices_from_readings", "figures_from_slices", "MIN_GAPS",
           "MIN_FIRST_TOKENS", "busy_span_figures", "MIN_SPAN_STEPS", "EMPTY_AT_MOST",
           "MAX_SPAN_SLICES"]  # fmt: skip

MIN_GAPS = 50  # a slice with fewer token gaps than this is no figure (a few streams' noise)
MIN_FIRST_TOKENS = 4  # a load's time to first token is a figure from this many first tokens
MAX_FIGURES = 200  # the loads with the most gaps are kept beyond this (the fit's cost grows)
_MAX_LEN = 10_000_000  # a mean length beyond this is a broken exporter, not a request
_MAX_COUNT = 1e18  # as the sidecar's parser bounds a counter (sidecar/contract/vocabulary.py)


@dataclass(frozen=True)
class Reading:
    """One reading of one engine's counters (cumulative) and the requests it holds; None where
    the server does not export the family."""

    t: float  # seconds, any origin (monotonic, or unix for Prometheus)
    held: float | None  # requests the server holds: running + waiting
    itl_sum: float | None
    itl_count: float | None
    prompt_sum: float | None
    prompt_count: float | None
    output_sum: float | None
    output_count: float | None
    preemptions: float | None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    steps: float | None = None  # engine steps (iteration_tokens_total's count)
    prompt_computed: float | None = None  # prompt tokens computed (cache hits not)
    generated: float | None = None  # tokens generated, first tokens included


@dataclass(frozen=True)
class Slice:
    """What one engine did between two readings: counters' increases and the requests held."""

    start: float
    end: float
    held: float  # mean requests held (running + waiting): a closed loop's streams
    itl_sum: float
    itl_count: float
    prompt_sum: float
    prompt_count: float
    output_sum: float
    output_count: float
    preemptions: float
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    # the requests held, mean over the slice's first and second half (None: not read)
    held_first: float | None = None
    held_second: float | None = None
    steps: float = 0.0
    prompt_computed: float = 0.0
    generated: float = 0.0
    # the share of its readings that found the server empty (None: not known)
    empty_share: float | None = None

    def unsteady(self) -> bool:
        """Whether the load moved inside the slice (a closed loop's start or drain, a sweep's
        next stage): its gaps are a mix of loads, none of them the mean's. A trend between
        its halves, not a dip: a closed loop's count dips each time a stream resends."""
        if self.held_first is None or self.held_second is None:
            return False
        moved = abs(self.held_second - self.held_first)
        return moved > max(_MOVED_AT_LEAST, _MOVED * self.held)


# a slice whose halves' requests held differ by more than half the mean, and by more than two
# requests, is unsteady: a sweep's next stage or a drain moves that much, while a few sampled
# dips (a closed loop's streams resending; Prometheus has two or three points a half) do not
_MOVED = 0.5
_MOVED_AT_LEAST = 2.0
# a slice whose requests held average under this had no request in the server. Not 0.5: one
# stream of short requests is out of the engine (the client, the API server) for much of each
# request, and its token gaps are still one stream's (under 0.5, CI left three slices out as
# holding no request, and the calibration with them; the 50 gaps a figure needs prove it ran)
_HELD_AT_LEAST = 0.1


_COUNTERS = ("itl_sum", "itl_count", "prompt_sum", "prompt_count", "output_sum",
             "output_count", "preemptions", "ttft_sum", "ttft_count", "steps",
             "prompt_computed", "generated")  # fmt: skip
_NEEDED = {"itl_sum": "the inter-token latency histogram", "held": "the running gauge"}


def slices_from_readings(
    readings: Sequence[Reading], slice_s: float
) -> tuple[list[Slice], list[str]]:
    """Cut one engine's readings into slices of about `slice_s` seconds (each from one reading to
    the first at least `slice_s` later); the requests held are the mean of its readings. A
    counter that fell (a restart) or a family the server lacks leaves the slice out."""
    pts = sorted((r for r in readings if math.isfinite(r.t)), key=lambda r: r.t)
    slices: list[Slice] = []
    skipped: list[str] = []
    i = 0
    while i < len(pts):
        j = i + 1
        while j < len(pts) and pts[j].t - pts[i].t < slice_s:
            j += 1
        if j >= len(pts):
            break
        a, b = pts[i], pts[j]
        span = f"{b.t - a.t:.0f} s slice ending at {b.t:.0f}"
        inside = [r for r in pts[i : j + 1] if r.held is not None]
        held = [r.held for r in inside if r.held is not None]
        missing = [why for name, why in _NEEDED.items()
                   if (not held if name == "held" else getattr(b, name) is None)]  # fmt: skip
        if missing:
            skipped.append(f"{span}: the server exports no {' or '.join(missing)}")
        else:
            inc = {n: _increase(getattr(a, n), getattr(b, n)) for n in _COUNTERS}
            if any(v is None for v in inc.values()) or _fell(pts[i : j + 1]):
                skipped.append(f"{span}: a counter fell (the server restarted)")
            else:
                counts = {n: float(v or 0.0) for n, v in inc.items()}
                mid = (a.t + b.t) / 2
                first = [r.held for r in inside if r.t <= mid and r.held is not None]
                second = [r.held for r in inside if r.t > mid and r.held is not None]
                slices.append(Slice(a.t, b.t, _avg(held), **counts,
                                    held_first=_avg(first) if first else None,
                                    held_second=_avg(second) if second else None,
                                    empty_share=sum(h < 1 for h in held) / len(held)))  # fmt: skip
        i = j
    return slices, skipped


def _avg(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _fell(run: Sequence[Reading]) -> bool:
    """Whether any counter fell between two readings of the run (a restart inside a slice)."""
    for n in _COUNTERS:
        vals = [v for r in run if (v := getattr(r, n)) is not None]
        if any(y < x for x, y in zip(vals, vals[1:], strict=False)):
            return True
    return False


def _increase(a: float | None, b: float | None) -> float | None:
    """b - a; 0 where the server lacks the family at either end; None if it fell."""
    if a is None or b is None:
        return 0.0
    return b - a if b >= a else None


def figures_from_slices(
    slices: Sequence[Slice], batched_tokens: int, max_num_seqs: int, source: str = ""
) -> tuple[list[Figure], list[str]]:
    """Each usable slice's load and TPOT, pooled by load; what was left out and why (counted).

    A slice in which no request finished has no lengths of its own: it takes those of the
    nearest slices before and after it in which some did, where they agree (one load ran
    across it) or only one side has any; where they differ it is left out (a load's boundary).
    Its figure's label says so. (The mean of every slice, as before, gave a 16-stream load of
    3,072-token prompts the 736 of the whole span on the twin at time scale 6, where few
    requests finish in a 3 s slice, and the fit read its TTFT 66% off.)

    A server that counts its steps (`vllm:iteration_tokens_total`, every V1 release) gives
    busy spans instead (`busy_span_figures`); the steady-loop figures below are for one
    that does not."""
    if any(s.steps > 0 for s in slices):
        return busy_span_figures(slices, batched_tokens, max_num_seqs, source)
    usable: list[Slice] = []
    why: dict[str, int] = {}

    def skip(reason: str) -> None:
        why[reason] = why.get(reason, 0) + 1

    for s in slices:
        if not _counted(s):
            skip("a value no server counts (negative, not a number, or past 1e18)")
        elif s.unsteady():
            skip(f"the load moved in it ({_MOVED:.0%} more or fewer requests in its second half)")
        elif s.preemptions > 0:
            skip("preempted in it (recompute is in its gaps)")
        elif s.held < _HELD_AT_LEAST:
            skip("no request in the server")
        elif s.itl_count < MIN_GAPS or s.itl_sum <= 0:
            skip(f"fewer than {MIN_GAPS} token gaps")
        else:
            usable.append(s)
    finished = _finished(slices)
    groups: dict[tuple[int, int, int, bool], list[tuple[Slice, float, float]]] = {}
    for s in usable:
        own = None not in (_mean(s.prompt_sum, s.prompt_count), _mean(s.output_sum, s.output_count))
        lengths = _lengths(s, finished)
        if isinstance(lengths, str):
            skip(lengths)
            continue
        p, o = lengths
        key = (max(1, round(s.held)), _coarse(p), _coarse(o), own)
        groups.setdefault(key, []).append((s, p, o))
    ranked = sorted(groups.items(), key=lambda kv: -sum(s.itl_count for s, _, _ in kv[1]))
    if len(ranked) > MAX_FIGURES:
        why[f"past the {MAX_FIGURES} loads with the most gaps"] = sum(
            len(g) for _, g in ranked[MAX_FIGURES:]
        )
        ranked = ranked[:MAX_FIGURES]
    figures = []
    for (conc, _, _, own), members in ranked:
        gaps = sum(s.itl_count for s, _, _ in members)
        p = round(sum(p * s.itl_count for s, p, _ in members) / gaps)
        o = max(2, round(sum(o * s.itl_count for s, _, o in members) / gaps))
        load = Load("fixed_concurrency", conc, max(1, p), o, batched_tokens, max_num_seqs)
        tpot = sum(s.itl_sum for s, _, _ in members) / gaps
        firsts = sum(s.ttft_count for s, _, _ in members)
        ttft = sum(s.ttft_sum for s, _, _ in members) / firsts if firsts else 0.0
        n = len(members)
        label = (
            f"{source}{' ' if source else ''}{n} slice{'s' if n > 1 else ''}: {conc} "
            f"stream{'s' if conc > 1 else ''} of {p:,} + {o:,} tokens"
            + ("" if own else " (lengths of the slices around: none finished in these)")
        )
        figures.append(Figure(label, load, "tpot_s", tpot))
        if firsts >= MIN_FIRST_TOKENS and ttft > 0:  # what pins the prefill's cost
            figures.append(Figure(label, load, "ttft_s", ttft))
    skipped = [f"{n} slice{'s' if n > 1 else ''}: {r}" for r, n in why.items()]
    return figures, skipped


MIN_SPAN_STEPS = 50  # a busy span of fewer engine steps is no figure
# a slice in which more of the readings than this found the server empty is idle, not busy;
# under it, its busy seconds are its seconds less that share (a closed loop's streams all
# finish together at a wave's end, and a reading can find the server empty while they resend).
# Not a quarter: on a slow machine a 4-stream loop's resends take 2-3 of a 3 s slice's 7
# readings, and every other slice left out cut the load into spans under 50 steps (CI of
# d469617 lost it so); the four twin recordings read within 3.5% either way (docs/twin.md)
EMPTY_AT_MOST = 0.5
# a span longer than this many slices is cut: a server busy for hours gives a figure per this
# many slices, so a load that drifts is seen as several
MAX_SPAN_SLICES = 40


def busy_span_figures(
    slices: Sequence[Slice], batched_tokens: int, max_num_seqs: int, source: str = ""
) -> tuple[list[Figure], list[str]]:
    """The mean engine step of each busy span, with the span's own mix (`measured.py`).

    A slice is busy when its readings found the server empty at most `EMPTY_AT_MOST` of the
    time: its busy seconds over its steps are the mean step. Consecutive busy slices of one
    request length pool into one span, whatever the requests held (the mix is the span's own):
    a prompt's counters land in the slice where its first token came, its computation partly
    in the slice before, so a short span that cuts a wave's prefill reads its step up to 30%
    off (3 s slices of a 64-stream loop on the twin), a long one within 1%. Cutting spans
    where the requests held moved by a third cut them at every wave's end, which is where the
    prefills are (the twin's third set of hidden constants: mfu +11% so, +2% without). A busy
    slice in which no step ended is inside a long step (a prefill of 8,192 tokens at a low
    MFU) and stays in its span: ending the span there left the step's prompts counted in the
    next span without its time (the twin's first set: spans read 8-23% slow). A slice that
    preempted, was idle, or has no lengths ends the span it was in."""
    why: dict[str, int] = {}
    spans: list[list[tuple[Slice, float, float]]] = []
    finished = _finished(slices)
    current: list[tuple[Slice, float, float]] = []

    def count(reason: str, n: int = 1) -> None:
        why[reason] = why.get(reason, 0) + n

    def end_span(reason: str | None = None) -> None:
        if reason:
            count(reason)
        if current:
            spans.append(list(current))
            current.clear()

    for s in sorted(slices, key=lambda x: x.start):
        if not _counted(s):
            end_span("a value no server counts (negative, not a number, or past 1e18)")
            continue
        if s.preemptions > 0:
            end_span("preempted in it (recompute is in its steps)")
            continue
        if s.empty_share is None or s.empty_share > EMPTY_AT_MOST or s.held < 1:
            end_span(f"the server was empty at more than {EMPTY_AT_MOST:.0%} of its readings, "
                     "or at one where the share is not known (Prometheus)")  # fmt: skip
            continue
        lengths = _lengths(s, finished)
        if isinstance(lengths, str):
            end_span(lengths)
            continue
        p, o = lengths
        if current:
            last, lp, lo = current[-1]
            if (
                abs(s.start - last.end) > 1e-3
                or (_coarse(p), _coarse(o)) != (_coarse(lp), _coarse(lo))
                or len(current) == MAX_SPAN_SLICES
            ):
                end_span()
        current.append((s, p, o))
    end_span()
    figures: list[Figure] = []
    short = 0
    ranked = sorted(spans, key=lambda g: -sum(s.steps for s, _, _ in g))
    for members in ranked:
        steps = sum(s.steps for s, _, _ in members)
        if steps < MIN_SPAN_STEPS:
            short += len(members)
            continue
        if len(figures) == MAX_FIGURES:
            count(f"past the {MAX_FIGURES} spans with the most steps", len(members))
            continue
        seconds = sum((s.end - s.start) * (1 - (s.empty_share or 0.0)) for s, _, _ in members)
        generated = sum(s.generated for s, _, _ in members)
        computed = sum(s.prompt_computed for s, _, _ in members)
        p = round(sum(p * s.steps for s, p, _ in members) / steps)
        o = max(2, round(sum(o * s.steps for s, _, o in members) / steps))
        batch = generated / steps
        load = Load("busy_span", max(1, round(batch)), max(1, p), o, batched_tokens,
                    max_num_seqs, steps=round(steps), generated=max(1, round(generated)),
                    prefill_tokens=round(computed),
                    prefills=round(sum(s.ttft_count for s, _, _ in members)))  # fmt: skip
        n = len(members)
        label = (
            f"{source}{' ' if source else ''}{n} slice{'s' if n > 1 else ''} busy "
            f"{seconds:,.1f} s: {batch:,.1f} tokens a step, {p:,} + {o:,} tokens, "
            f"{computed:,.0f} prompt tokens computed"
        )
        figures.append(Figure(label, load, "step_s", seconds / steps))
    if short:
        count(f"in spans of fewer than {MIN_SPAN_STEPS} engine steps", short)
    return figures, [f"{n} slice{'s' if n > 1 else ''}: {r}" for r, n in why.items()]


def _counted(s: Slice) -> bool:
    """Whether the slice's values are counts a server could give (see figures_from_slices)."""
    values = [getattr(s, f.name) for f in fields(s) if f.name not in ("start", "end")]
    return all(0 <= v <= _MAX_COUNT for v in values if v is not None)


def _finished(slices: Sequence[Slice]) -> list[tuple[float, float, float]]:
    """(start, mean prompt, mean output) of each slice in which requests finished, in order."""
    return sorted((s.start, p, o) for s in slices if _counted(s)
                  and (p := _mean(s.prompt_sum, s.prompt_count)) is not None
                  and (o := _mean(s.output_sum, s.output_count)) is not None)  # fmt: skip


def _lengths(s: Slice, finished: Sequence[tuple[float, float, float]]) -> tuple[float, float] | str:
    """The slice's own mean lengths, or those around it (`_lengths_around`); or why none."""
    p, o = _mean(s.prompt_sum, s.prompt_count), _mean(s.output_sum, s.output_count)
    lengths = (p, o) if p is not None and o is not None else _lengths_around(finished, s.start)
    if isinstance(lengths, str):
        return lengths
    if not (1 <= lengths[0] <= _MAX_LEN and 1 <= lengths[1] <= _MAX_LEN):
        return "request lengths no server has"
    return lengths


def _lengths_around(
    finished: Sequence[tuple[float, float, float]], start: float
) -> tuple[float, float] | str:
    """The mean lengths of the nearest slices before and after `start` in which requests
    finished, (start, prompt, output) in time order: where both sides agree within 5%, or one
    side has none; otherwise why not."""
    i = bisect_left(finished, (start,))
    sides = [finished[j][1:] for j in (i - 1, i) if 0 <= j < len(finished)]
    if not sides:
        return "no request finished in it or any other slice (lengths unknown)"
    (p, o), *rest = sides
    if rest and (_coarse(p), _coarse(o)) != (_coarse(rest[0][0]), _coarse(rest[0][1])):
        return "no request finished in it, and the slices around it differ (a load's boundary)"
    return p, o


def _mean(total: float, count: float) -> float | None:
    return total / count if count >= 1 and total >= 0 else None


def _coarse(x: float) -> int:
    """A length to 5%: slices within it are one load (a log scale, so short and long alike)."""
    return round(math.log(max(x, 1.0)) / math.log(1.05))
