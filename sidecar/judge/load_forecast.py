"""What the load needs of the cache when it levels, and when a growing load runs it out: the
forecast from what drives KV use, not from the usage curve.

By Little's law the requests a load holds when it levels are its admission rate x how long a
request holds its blocks, and the blocks they hold that x the blocks one holds on average:

- admissions per second: vLLM's prompt-token counter over the mean prompt (a quadratic through
  the counter's last `WINDOW_S` gives the rate now and its trend; the counter integrates the
  arrivals' noise, which a usage curve does not). Under `MIN_ADMISSIONS` in the window there
  is no figure, and a trend counts only where it moved the rate by more than twice the count's
  own noise;
- residence: the mean output length x the time between a request's tokens (running requests /
  generation tokens per second: each running request gets one token a step). The step time is
  fitted as a line in the requests running over the window's bins, since a bigger batch steps
  slower (on the twin's H100 ramps it went from 8 to 21 ms as the batch grew from 9 to 103); a
  batch that has not moved keeps the step as it is now;
- blocks a request holds over its life: its prompt and half its output, in blocks, plus half a
  block for the one being filled (it grows linearly while it decodes);
- the mean prompt and output lengths: vLLM's per-request histograms (sums over counts) of the
  finished requests.

`steady_demand_blocks` against the cache is a live KV onset; `headroom` is how much more
arrival rate the cache holds at these lengths (negative: this load does not fit, whatever the
curve says now). The countdown: a load that does not fit fills the gap between the blocks held
and the cache as admissions outrun finishes; a load that fits but grows reaches the rate the
cache holds after (that rate - the rate now) / trend, and the blocks held follow the arrivals
half a residence late. None: the load levels below the cache, or the figures cannot tell.
Prefill time is left out of the residence. Pure: the caller passes the points and the time.
The step line extrapolated from light batches of long prompts reads far too steep (their
prefill rides in the batch), so the countdown takes this forecast only where the usage agrees
(signals.exhaustion_seconds, `exhaustion_usage_check_s`; docs/detection.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.sidecar.contract.vocabulary import RUNNING
from kvwatch.sidecar.judge.forecast import MIN_POINTS, least_squares, line_fit, quadratic_fit
from kvwatch.sidecar.judge.timeline import counter_increase
from kvwatch.sidecar.metrics.observe import EngineObservation
from kvwatch.timing.steptime import touched_share

__all__ = ["WINDOW_S", "SPEED_S", "LoadForecast", "StepCurve", "forecast_from_load"]

WINDOW_S = 60.0  # the admission counter's span for its rate and trend
SPEED_S = 10.0  # the span of the step time (running / generation rate)
BIN_S = 5.0  # the step time's bins, to fit it against the requests running
# fewer admissions than this in the window and the rate is mostly the arrivals' noise (a
# Poisson count of 50 is +-14%): no figure
MIN_ADMISSIONS = 50
SPREAD = 0.25  # the batch must have moved by this share of its mean to fit a line
MIN_SPAN_S = 10.0  # a shorter history gives no rate
_SSE_FLOOR = 1e-18  # a mean squared step error (s^2) this small is an exact fit


@dataclass(frozen=True)
class LoadForecast:
    admissions_per_s: float  # the rate now
    admissions_trend_per_s2: float  # its change per second
    residence_s: float  # how long a request holds its blocks
    blocks_per_request: float  # the blocks a running request holds on average
    steady_demand_blocks: float | None  # what it holds when it levels; None: it grows unbounded
    headroom: float  # the arrival rate the cache holds / the rate now - 1
    seconds: float | None  # until the load's demand passes the cache; None: it levels below


def _mean(total: float | None, count: float | None) -> float | None:
    if total is None or count is None or not count > 0 or not math.isfinite(total / count):
        return None
    return total / count if total / count > 0 else None


def forecast_from_load(
    points: Sequence[tuple[float, EngineObservation]],
    now: float,
    capacity_blocks: int | None,
    block_size: int | None,
    routed_share: float = 0.0,
) -> LoadForecast | None:
    """`points`: one engine's (monotonic seconds, observation), oldest first. `routed_share`:
    a MoE model's experts per token over its routed experts (k/E; 0: dense or unknown), from
    the served model's config: the step's growth with the batch then bends (StepCurve)."""
    # the parser bounds what a scrape says (vocabulary.RUNNING); a caller's points are held to
    # it here too: a running count outside it leaves its scrape out
    lo, hi = RUNNING.bounds
    points = [(t, o) for t, o in points if o.running is None or lo <= o.running <= hi]
    if not capacity_blocks or not block_size or not points:
        return None
    last = points[-1][1]
    prompt = _mean(last.prompt_len_sum, last.prompt_len_count)
    output = _mean(last.output_len_sum, last.output_len_count)
    if prompt is None or output is None:
        return None
    pts = _admitted([(t, o) for t, o in points if t >= now - WINDOW_S], now, prompt)
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < MIN_SPAN_S:
        return None
    admitted = pts[-1][1] - pts[0][1]
    if admitted < MIN_ADMISSIONS:
        return None
    q = quadratic_fit(pts)
    if q is None:
        return None
    _, rate, half_trend = q
    span = pts[-1][0] - pts[0][0]
    # a trend counts where it moved the rate over the window by more than twice the count's
    # own noise (a Poisson count n is +-sqrt(n)): a steady load's fitted bend is noise
    trend = 2 * half_trend if abs(2 * half_trend) * span > 2 * math.sqrt(admitted) / span else 0.0
    recent = [(t, o) for t, o in points if t >= now - SPEED_S]
    step_now = _step_s(recent)
    if step_now is None or not rate > 0:
        return None
    running = statistics.fmean(o.running or 0.0 for _, o in recent)
    step = _step_curve([(t, o) for t, o in points if t >= now - WINDOW_S], step_now, routed_share)
    per_request = (prompt + output / 2) / block_size + 0.5
    most = capacity_blocks / per_request  # the requests the cache holds at these lengths
    holds = most / (output * step.at(most))  # the arrival rate that fills it
    headroom = holds / rate - 1
    # Little's law with the step time growing with the batch: N = rate x output x step(N)
    level = step.level(rate * output)
    demand = None if level is None else level * per_request  # None: it grows without bound
    residence = output * step_now
    held = (last.kv_usage or 0.0) * capacity_blocks
    seconds: float | None
    if headroom <= 0:  # this load does not fit: admissions outrun finishes until it is full
        gap = capacity_blocks - held
        inflow = max(rate - running / residence, 0.0) * per_request
        if demand is not None:
            inflow = max(inflow, (demand - held) / residence)
        seconds = 0.0 if gap <= 0 else gap / max(inflow, 1e-9)
    elif trend > 0:  # it fits, and grows: the rate reaches what the cache holds, and the
        # blocks held follow the arrivals about half a residence late
        seconds = (holds - rate) / trend + output * step.at(most) / 2
    else:
        seconds = None
    return LoadForecast(rate, trend, residence, per_request, demand, headroom, seconds)


@dataclass(frozen=True)
class StepCurve:
    """The time between a running request's tokens at a batch of n: fixed + per_running x n
    + per_touched x the share of a MoE layer's experts n tokens route to (1 - (1 - k/E)^n).
    A dense model's step grows with its batch as a line (the KV each request reads); a MoE's
    bends over, as more of its experts are read until all are (on the twin's MoE ramps 4 ms
    at one request, 24 ms at 40, 33 ms at 94: a line through the first 40 says 52 ms)."""

    fixed: float
    per_running: float
    per_touched: float = 0.0
    routed_share: float = 0.0

    def at(self, n: float) -> float:
        bent = self.per_touched * touched_share(n, self.routed_share)
        return self.fixed + self.per_running * n + bent

    def level(self, load: float) -> float | None:
        """The batch N = load x step(N) a load of `load` (arrivals x output tokens) levels at;
        None where the step grows as fast as the batch (no level)."""
        if load * self.per_running >= 1:
            return None
        # the root of load x step(N) - N: positive at 0, concave, negative past `hi`
        hi = load * (self.fixed + self.per_touched) / (1 - load * self.per_running)
        if self.per_touched == 0:
            return hi
        lo = 0.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if load * self.at(mid) > mid else (lo, mid)
        return (lo + hi) / 2


def _step_curve(
    points: Sequence[tuple[float, EngineObservation]], step_now: float, routed_share: float
) -> StepCurve:
    """The step against the requests running, fitted to the window's bins of BIN_S (a bigger
    batch reads more KV a step, and a growing load batches more prefill beside it), no term
    negative: a line, or for a MoE model the bent curve. Where the batch has not moved enough
    to fit (a steady load), the step as it is now and no growth."""
    bins: list[tuple[float, float]] = []
    start = 0
    for k in range(1, len(points) + 1):
        if k == len(points) or points[k][0] - points[start][0] >= BIN_S:
            step = _step_s(points[start:k])
            if step is not None:
                bins.append((statistics.fmean(o.running or 0.0 for _, o in points[start:k]), step))
            start = k
    if len(bins) < 3:
        return StepCurve(step_now, 0.0)
    ns = [n for n, _ in bins]
    mean_n = statistics.fmean(ns)
    if max(ns) - min(ns) < SPREAD * mean_n:
        return StepCurve(step_now, 0.0)
    if routed_share > 0:
        bent = _bent_fit(bins, routed_share)
        if bent is not None:
            return bent
    slope, mn, ms = line_fit(bins)
    slope = max(slope, 0.0)
    fixed = ms - slope * mn
    if fixed <= 0:  # proportional through the origin at most
        return StepCurve(0.0, ms / mn)
    return StepCurve(fixed, slope)


def _bent_fit(bins: Sequence[tuple[float, float]], routed_share: float) -> StepCurve | None:
    """Least squares of step = fixed + per_running x n + per_touched x touched(n) with no
    term negative: among the subsets of terms that keep the touched one (the model is a MoE)
    whose least squares has none negative, the one of least BIC (m ln(SSE / m) + k ln m over
    m bins), so a term is kept only where it explains more than the bins' noise. The curve
    is read far past the batches it was fitted on (at the requests the cache holds): on the
    twin's MoE under Azure's conversations, bins of 17-31 running fitted a 0.5 ms
    per-request slope by the least SSE, which doubled the step at 95 and warned at 20-30% KV
    (docs/detection.md). None: no such subset."""
    rows = [(1.0, n, touched_share(n, routed_share)) for n, _ in bins]
    ys = [y for _, y in bins]
    m = len(ys)
    best: tuple[float, StepCurve] | None = None
    for mask in ((0, 1, 2), (0, 2), (1, 2), (2,)):
        if len(mask) >= m:
            continue  # as many terms as bins fit them exactly, noise and all
        coef = least_squares([[r[i] for i in mask] for r in rows], ys)
        if coef is None or min(coef) < 0:
            continue
        full = [0.0, 0.0, 0.0]
        for i, c in zip(mask, coef, strict=True):
            full[i] = c
        sse = sum((y - sum(f * x for f, x in zip(full, r, strict=True))) ** 2
                  for r, y in zip(rows, ys, strict=True))  # fmt: skip
        bic = m * math.log(max(sse / m, _SSE_FLOOR)) + len(mask) * math.log(m)
        if best is None or bic < best[0]:
            best = (bic, StepCurve(full[0], full[1], full[2], routed_share))
    return None if best is None else best[1]


def _admitted(
    points: Sequence[tuple[float, EngineObservation]], now: float, prompt: float
) -> list[tuple[float, float]]:
    """Requests admitted since the window's start (prompt tokens over the mean prompt), at
    times relative to now; a counter that fell (a restart) counts on from zero."""
    out: list[tuple[float, float]] = []
    total, prev = 0.0, None
    for t, o in points:
        v = o.prompt_tokens_total
        if v is None or not math.isfinite(v):
            continue
        if prev is not None:
            total += counter_increase(prev, v)
        prev = v
        out.append((t - now, total / prompt))
    return out


def _step_s(recent: Sequence[tuple[float, EngineObservation]]) -> float | None:
    """The time between a running request's tokens: requests running / tokens per second."""
    if len(recent) < 2:
        return None
    (t0, a), (t1, b) = recent[0], recent[-1]
    if a.generation_tokens_total is None or b.generation_tokens_total is None or t1 <= t0:
        return None
    gen = (b.generation_tokens_total - a.generation_tokens_total) / (t1 - t0)
    running = statistics.fmean(o.running or 0.0 for _, o in recent)
    if not gen > 0 or not running > 0:
        return None
    return running / gen
