"""Stall seconds by cause, judged from the server's side alone (its /metrics, scrape by scrape).

The load generator names one cause per stall from what a client sees (loadgen/results/
stall_causes.py). A sidecar has no streams, but vLLM's inter-token latency histogram holds every
gap of every stream: between two scrapes, the gaps that landed above the stall line are the
stalls of that window (each is observed when it ends), and the counters say what the server did:
- a gap that held a preemption: vLLM counts one with the victim's next output, which under
  async scheduling is its last token before the gap (on the twin, vLLM 0.32, the counter rose
  in the same second as the step that preempted, 182 times of 182, seconds before the
  victim's gap lands in the histogram) and without it the first after; so a rise between two
  scrapes that meets (window start - the gap's upper bound, window end], one gap per
  preemption, the longest gaps first: `preemption` (the client's `preempted`; the streams
  held behind a victim's recompute are not told apart from the prompts' stalls);
- another gap, where prompt tokens were computed while it could have lasted: in a window that
  meets (window start - the gap's upper bound, window end] (vLLM counts a prompt's tokens with
  its first token, at the end of the step that held the others up, and that can be a scrape
  before the gap lands in the histogram; its tokens-per-step histogram counts them the same
  way, so a prompt chunked over many steps shows in neither before its last chunk):
  `prefill` (prompts batched beside decodes);
- neither: `other` (the client's `queue`, `host` and `unknown`: nothing on the server says).

The stall line is the client's (loadgen/results/records.py StallRule): 5x the median gap and at
least 0.25 s, the median over every gap since the server started (the client takes each
stream's own), on the judges' clock (a twin's gaps divided by its time scale). A
histogram knows a gap only to its bucket: a bucket that straddles the line counts the share of
it above the line (linear within the bucket, as Prometheus' histogram_quantile reads one), and
each gap counts as the middle of its part of the bucket; gaps past the last finite bound count
as that bound (at least). Each bucket of a window takes one cause. The bench that holds this to
the client's view and the twin's step trace: bench/bench_stall_causes.py (docs/detection.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvwatch.sidecar.metrics.observe import Buckets

__all__ = [
    "MIN_S", "SERVER_CAUSES", "Rise", "StallCount", "StallTally", "StallWindow", "window_stalls",
]  # fmt: skip

SERVER_CAUSES = ("preemption", "prefill", "other")
FACTOR = 5.0  # x the server's median gap (StallRule.factor: x the stream's own)
MIN_S = 0.25  # and at least this (StallRule.min_s)
KEEP_RISES_S = 600.0  # how far back a preemption may have begun a gap (longer: past +Inf's 80 s)
KEEP_PREFILLS_S = 120.0  # how far back computed prompts may have begun a gap


@dataclass(frozen=True)
class StallCount:
    """Stalls and their seconds, summed since the sidecar began watching the engine."""

    stalls: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class StallWindow:
    """What one scrape window held: the gaps over the stall line and their seconds, by cause."""

    by_cause: Mapping[str, StallCount]

    @property
    def stalls(self) -> float:
        return math.fsum(c.stalls for c in self.by_cause.values())

    @property
    def seconds(self) -> float:
        return math.fsum(c.seconds for c in self.by_cause.values())


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


@dataclass
class Rise:
    """The preemption counter rose by `left` (what no gap has claimed yet) between scrapes at
    `a` and `b`: each preemption is one victim's gap."""

    a: float
    b: float
    left: float


def _claim(rises: Sequence[Rise], t0: float, t1: float, hi: float, n: float) -> float:
    """How many of `n` gaps up to `hi` long that ended in (t0, t1] were victims: each holds a
    preemption, counted with its last token before the gap (async scheduling) or its first
    after it, so in a rise that meets (t0 - hi, t1] and is not yet claimed; the oldest rises
    first. Claims what it finds."""
    got = 0.0
    for r in rises:
        if got >= n:
            break
        if r.left > 0 and r.a < t1 and r.b > t0 - hi:
            take = min(r.left, n - got)
            r.left -= take
            got += take
    return got


def window_stalls(
    before: Buckets,
    after: Buckets,
    prompt_computed: float,
    scale: float = 1.0,
    rises: Sequence[Rise] = (),
    window: tuple[float, float] = (0.0, 0.0),
    prefills: Sequence[tuple[float, float]] = (),
) -> StallWindow | None:
    """The stalls among the gaps between two scrapes at `window` (t0, t1] of the ITL
    histogram (`scale`: a twin's time scale, its gaps divided by it); `rises`: where the
    preemption counter rose, on the same clock (the victims found claim theirs);
    `prompt_computed`: prompt tokens computed in this window, `prefills`: earlier windows
    (a, b] in which some were. None when the histogram is absent or broken, or no gap landed
    in the window."""
    cum = _delta(before, after)
    if cum is None or cum[-1][1] <= 0:
        return None
    t0, t1 = window
    k = scale if scale > 0 and math.isfinite(scale) else 1.0
    cum = tuple((le / k, n) for le, n in cum)
    # the norm is the server's, over every gap since it started (a stream is judged against
    # its own life by the client): a minute of prefill freezes is a minute of stalls, not a
    # new normal, as it would be against the window's own median
    line = max(FACTOR * _median_bound(after) / k, MIN_S)

    def otherwise(hi: float) -> str:
        """A gap up to `hi` long that held no preemption: prefill where prompts were computed
        while it lasted."""
        if prompt_computed > 0 or any(a < t1 and b > t0 - hi for a, b in prefills):
            return "prefill"
        return "other"

    parts: list[tuple[float, float, float]] = []  # (upper bound, gaps, seconds each)
    lo, below = 0.0, 0.0
    for hi, n in cum:
        count = n - below
        if count > 0 and hi > line:
            start = max(lo, line)
            if math.isinf(hi):  # past the last finite bound: at least that long
                parts.append((hi, count, start))
            else:
                part = count * (hi - start) / (hi - lo) if hi > lo else count
                parts.append((hi, part, (start + hi) / 2.0))
        lo, below = hi, n
    acc: dict[str, tuple[float, float]] = {}

    def add(cause: str, n: float, each: float) -> None:
        if n > 0:
            got = acc.get(cause, (0.0, 0.0))
            acc[cause] = (got[0] + n, got[1] + n * each)

    for hi, n, each in reversed(parts):  # the longest gaps claim the victims first
        victims = _claim(rises, t0, t1, hi, n)
        add("preemption", victims, each)
        add(otherwise(hi), n - victims, each)
    total = sum(n for n, _ in acc.values())
    if total <= 0 or not all(math.isfinite(sec) for _, sec in acc.values()):
        return None
    return StallWindow({c: StallCount(n, sec) for c, (n, sec) in acc.items()})


@dataclass
class StallTally:
    """One engine's stalls by cause since the sidecar began, scrape by scrape."""

    counts: dict[str, StallCount] = field(
        default_factory=lambda: {c: StallCount() for c in SERVER_CAUSES}
    )
    broken: int = 0  # windows whose histogram could not be read (counted, never guessed)
    seen: bool = False  # the server exports the histogram (else nothing is said, not zeros)
    _last: Buckets = ()
    _last_t: float | None = None
    _rises: deque[Rise] = field(default_factory=deque)
    _prefills: deque[tuple[float, float]] = field(default_factory=deque)  # windows with prompts

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
        rose = 0.0 if step is None else step.get("preemptions_total", 0.0)
        if t0 is not None and rose > 0:
            self._rises.append(Rise(t0, t, rose))
        while self._rises and (self._rises[0].b < t - KEEP_RISES_S or not self._rises[0].left):
            self._rises.popleft()
        if not buckets:
            return None
        self.seen = True
        if not before or step is None or t0 is None or not _valid(before):
            # no window to read (the first scrape, a point refused, or a broken one before
            # it): this scrape starts the history afresh, counted only if broken itself
            if not _valid(buckets):
                self.broken += 1
            return None
        if _delta(before, buckets) is None:
            self.broken += 1
            return None
        computed = step.get("prompt_tokens_computed_total") or step.get("prompt_tokens_total")
        got = window_stalls(
            before, buckets, computed or 0.0, scale or 1.0, self._rises, (t0, t), self._prefills
        )
        if computed:  # after the window is judged: the next windows' gaps may have begun here
            self._prefills.append((t0, t))
        while self._prefills and self._prefills[0][1] < t - KEEP_PREFILLS_S:
            self._prefills.popleft()
        if got is None:
            return None
        summed = {
            cause: StallCount(self.counts[cause].stalls + c.stalls,
                              self.counts[cause].seconds + c.seconds)
            for cause, c in got.by_cause.items()
        }  # fmt: skip
        if not all(math.isfinite(c.stalls) and math.isfinite(c.seconds) for c in summed.values()):
            self.broken += 1  # counts past any server's: a broken exporter
            return None
        self.counts.update(summed)
        return got

    def total_seconds(self) -> float:
        return math.fsum(c.seconds for c in self.counts.values())
