"""Stall seconds by cause, judged from the server's side alone (its /metrics, scrape by scrape).

The load generator names one cause per stall from what a client sees (loadgen/results/
stall_causes.py). A sidecar has no streams, but vLLM's inter-token latency histogram holds every
gap of every stream: between two scrapes, the gaps that landed above the stall line are the
stalls of that window (each is observed when it ends), and the counters say what the server did:
- a gap of the window could have begun when the preemption counter rose (a rise between two
  scrapes no earlier than the window's start less the gap's bucket bound): `preemption`, and
  the window's other stalls with it (the victim resumes in a step that recomputes it, and every
  stream waits for that step: the client's `preempted` and `recompute` together). vLLM 0.32
  counts a preemption with the victim's next output, which under async scheduling is its last
  token before the stall: on the twin the counter rose in the same second as the step that
  preempted, 182 of 182 (bench/bench_stall_causes.py, thrash), seconds before the victim's
  long gap lands in the histogram;
- else prompt tokens computed in the window (counted with a prompt's first token: the step
  that ends the others' stall): `prefill` (prompts batched beside the decodes);
- neither: `other` (the client's `queue`, `host` and `unknown`: nothing on the server says).

The stall line is the client's (loadgen/results/records.py StallRule): 5x the window's median
gap and at least 0.25 s, on the judges' clock (a twin's gaps divided by its time scale). A
histogram knows a gap only to its bucket: a bucket that straddles the line counts the share of
it above the line (linear within the bucket, as Prometheus' histogram_quantile reads one), and
each gap counts as the middle of its part of the bucket; gaps past the last finite bound count
as that bound (at least). A scrape window is one cause: where a window held a preemption's
stall and a prefill, every stall in it is the preemption's. The bench that holds this to the
client's view and the twin's step trace: bench/bench_stall_causes.py (docs/detection.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvwatch.sidecar.metrics.observe import Buckets

__all__ = ["MIN_S", "SERVER_CAUSES", "StallCount", "StallTally", "StallWindow", "window_stalls"]

SERVER_CAUSES = ("preemption", "prefill", "other")
FACTOR = 5.0  # x the window's median gap (StallRule.factor)
MIN_S = 0.25  # and at least this (StallRule.min_s)
KEEP_RISES_S = 600.0  # how far back a preemption may have begun a gap (longer: past +Inf's 80 s)


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


def _began_with_preemption(
    rises: Sequence[tuple[float, float]], t0: float, t1: float, hi: float
) -> bool:
    """Whether a gap up to `hi` long that ended in (t0, t1] could have begun at a preemption:
    a rise of the counter between two scrapes (a, b] with a < t1 and b > t0 - hi."""
    return any(a < t1 and b > t0 - hi for a, b in rises)


def window_stalls(
    before: Buckets,
    after: Buckets,
    prompt_computed: float,
    scale: float = 1.0,
    rises: Sequence[tuple[float, float]] = (),
    window: tuple[float, float] = (0.0, 0.0),
) -> StallWindow | None:
    """The stalls among the gaps between two scrapes at `window` (t0, t1] of the ITL
    histogram (`scale`: a twin's time scale, its gaps divided by it); `rises`: the spans
    between scrapes in which the preemption counter rose, on the same clock. None when the
    histogram is absent or broken, or no gap landed in the window."""
    cum = _delta(before, after)
    if cum is None or cum[-1][1] <= 0:
        return None
    k = scale if scale > 0 and math.isfinite(scale) else 1.0
    cum = tuple((le / k, n) for le, n in cum)
    line = max(FACTOR * _median_bound(cum), MIN_S)
    stalls = seconds = 0.0
    lo, below = 0.0, 0.0
    t0, t1 = window
    preempting = False
    for hi, n in cum:
        count = n - below
        if count > 0 and hi > line:
            preempting = preempting or _began_with_preemption(rises, t0, t1, hi)
            if math.isinf(hi):  # past the last finite bound: at least that long
                stalls, seconds = stalls + count, seconds + count * max(lo, line)
            else:
                start = max(lo, line)
                part = count * (hi - start) / (hi - lo) if hi > lo else count
                stalls, seconds = stalls + part, seconds + part * (start + hi) / 2.0
        lo, below = hi, n
    if stalls <= 0 or not math.isfinite(seconds):
        return None
    if preempting:
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
    _last_t: float | None = None
    _rises: deque[tuple[float, float]] = field(default_factory=deque)

    def add(
        self,
        t: float,
        buckets: Buckets,
        step: Mapping[str, float] | None,
        scale: float | None = None,
    ) -> StallWindow | None:
        """One scrape at `t` (the judges' clock): `buckets` the ITL histogram now, `step` the
        counters' increases since the last scrape (None: the timeline refused the point, so
        the window is skipped)."""
        before, self._last = self._last, buckets
        t0, self._last_t = self._last_t, t
        if step is not None and t0 is not None and step.get("preemptions_total", 0.0) > 0:
            self._rises.append((t0, t))
        while self._rises and self._rises[0][1] < t - KEEP_RISES_S:
            self._rises.popleft()
        if not buckets:
            return None
        if not before or step is None or t0 is None:
            if not _valid(buckets):
                self.broken += 1
            return None
        if _delta(before, buckets) is None:
            self.broken += 1
            return None
        computed = step.get("prompt_tokens_computed_total") or step.get("prompt_tokens_total")
        got = window_stalls(before, buckets, computed or 0.0, scale or 1.0, self._rises, (t0, t))
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
