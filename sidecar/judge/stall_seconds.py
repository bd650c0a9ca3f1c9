"""Stall seconds by cause, judged from the server's side alone (its /metrics, scrape by scrape).

The load generator names one cause per stall from what a client sees (loadgen/results/
stall_causes.py). A sidecar has no streams, but vLLM's inter-token latency histogram holds every
gap of every stream: between two scrapes, the gaps that landed above the stall line are the
stalls of that window, and the window's counters say what the server did meanwhile:
- the preemption counter rose: `preemption` (vLLM counts a preemption when its victim runs
  again, the step that ends the victim's stall and holds up the others behind its recompute:
  the client's `preempted` and `recompute` together);
- no preemption, prompt tokens computed: `prefill` (prompts batched beside the decodes);
- neither: `other` (the client's `queue`, `host` and `unknown`: nothing on the server says).

The stall line is the client's (loadgen/results/records.py StallRule): 5x the window's median
gap and at least 0.25 s, on the judges' clock (a twin's gaps divided by its time scale). A
histogram knows a gap only to its bucket: a bucket that straddles the line counts the share of
it above the line (linear within the bucket, as Prometheus' histogram_quantile reads one), and
each gap counts as the middle of its part of the bucket; gaps past the last finite bound count
as that bound (at least). A scrape window is one cause: where a window held a preemption and a
prefill, every stall in it is the preemption's. The bench that holds this to the client's view
and the twin's step trace: bench/bench_stall_causes.py (docs/detection.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvwatch.sidecar.metrics.observe import Buckets

__all__ = ["MIN_S", "SERVER_CAUSES", "StallCount", "StallTally", "StallWindow", "window_stalls"]

SERVER_CAUSES = ("preemption", "prefill", "other")
FACTOR = 5.0  # x the window's median gap (StallRule.factor)
MIN_S = 0.25  # and at least this (StallRule.min_s)


@dataclass(frozen=True)
class StallCount:
    """Stalls and their seconds, summed since the sidecar began watching the engine."""

    stalls: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class StallWindow:
    """What one scrape window held: gaps over the stall line, their seconds, and its cause."""

    stalls: float
    seconds: float
    cause: str


def _valid(b: Buckets) -> bool:
    """Bounds rising strictly to +Inf with a finite one before it, counts finite, from 0 and
    never falling: anything else is a broken histogram, read as nothing."""
    if len(b) < 2 or b[-1][0] != math.inf:
        return False
    last_le, last_n = -math.inf, 0.0
    for le, n in b:
        if not le > last_le or not math.isfinite(n) or n < last_n:
            return False
        last_le, last_n = le, n
    return True


def _delta(before: Buckets, after: Buckets) -> Buckets | None:
    """The gaps observed between two scrapes, per bucket (cumulative). A fall of the total, or
    other bounds, is a restart: the counts since it are `after` itself."""
    if not _valid(after):
        return None
    if not before or [le for le, _ in before] != [le for le, _ in after]:
        return after
    if after[-1][1] < before[-1][1]:
        return after
    out = tuple((le, max(0.0, n - m)) for (le, n), (_, m) in zip(after, before, strict=True))
    # counts per bucket can only fall where the total did (a restart, handled above): a
    # histogram whose cumulative counts fall is broken
    return out if _valid(out) else None


def _median_bound(cum: Buckets) -> float:
    """Upper bound of the bucket that holds the median gap (+Inf: the last finite bound)."""
    half = cum[-1][1] / 2.0
    finite = [le for le, _ in cum if math.isfinite(le)]
    for le, n in cum:
        if n >= half:
            return le if math.isfinite(le) else (finite[-1] if finite else MIN_S)
    return finite[-1] if finite else MIN_S


def window_stalls(
    before: Buckets, after: Buckets, preempted: float, prompt_computed: float, scale: float = 1.0
) -> StallWindow | None:
    """The stalls among the gaps between two scrapes of the ITL histogram (`scale`: a twin's
    time scale, its gaps divided by it); None when the histogram is absent or broken, or no
    gap landed in the window."""
    cum = _delta(before, after)
    if cum is None or cum[-1][1] <= 0:
        return None
    k = scale if scale > 0 and math.isfinite(scale) else 1.0
    cum = tuple((le / k, n) for le, n in cum)
    line = max(FACTOR * _median_bound(cum), MIN_S)
    stalls = seconds = 0.0
    lo, below = 0.0, 0.0
    for hi, n in cum:
        count = n - below
        if count > 0 and hi > line:
            if math.isinf(hi):  # past the last finite bound: at least that long
                stalls, seconds = stalls + count, seconds + count * max(lo, line)
            else:
                start = max(lo, line)
                part = count * (hi - start) / (hi - lo) if hi > lo else count
                stalls, seconds = stalls + part, seconds + part * (start + hi) / 2.0
        lo, below = hi, n
    if stalls <= 0 or not math.isfinite(seconds):
        return None
    if preempted > 0:
        cause = "preemption"
    elif prompt_computed > 0:
        cause = "prefill"
    else:
        cause = "other"
    return StallWindow(stalls, seconds, cause)


@dataclass
class StallTally:
    """One engine's stalls by cause since the sidecar began, scrape by scrape."""

    counts: dict[str, StallCount] = field(
        default_factory=lambda: {c: StallCount() for c in SERVER_CAUSES}
    )
    broken: int = 0  # windows whose histogram could not be read (counted, never guessed)
    _last: Buckets = ()

    def add(
        self,
        buckets: Buckets,
        step: Mapping[str, float] | None,
        scale: float | None = None,
    ) -> StallWindow | None:
        """One scrape: `buckets` the ITL histogram now, `step` the counters' increases since
        the last scrape (None: the timeline refused the point, so the window is skipped)."""
        before, self._last = self._last, buckets
        if not buckets:
            return None
        if not before or step is None:
            if not _valid(buckets):
                self.broken += 1
            return None
        if _delta(before, buckets) is None:
            self.broken += 1
            return None
        computed = step.get("prompt_tokens_computed_total") or step.get("prompt_tokens_total")
        got = window_stalls(
            before, buckets, step.get("preemptions_total", 0.0), computed or 0.0, scale or 1.0
        )
        if got is None:
            return None
        c = self.counts[got.cause]
        summed = StallCount(c.stalls + got.stalls, c.seconds + got.seconds)
        if not (math.isfinite(summed.stalls) and math.isfinite(summed.seconds)):
            self.broken += 1  # counts past any server's: a broken exporter
            return None
        self.counts[got.cause] = summed
        return got

    def total_seconds(self) -> float:
        return math.fsum(c.seconds for c in self.counts.values())
