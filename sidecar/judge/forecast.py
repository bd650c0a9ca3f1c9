"""When will the KV cache run out? The forecast behind `kvwatch_seconds_to_kv_exhaustion`.

Under load KV usage swings by a request's worth of blocks as requests are admitted and finish,
and vLLM preempts at the first swing that finds no block free: at a peak, not at the mean. So the
forecast follows the band the peaks live in: a least-squares line through KV usage over the last
`WINDOW_S`, lifted by `SPREAD_K` times the spread of the points around it. The forecast is the
time until that band reaches 100%; none while the line is flat or falling (a steady load,
however busy, is not heading for exhaustion), 0 once the band is already there.

On a big cache (10^4 blocks at H100 scale) usage does not swing: it rises smoothly, and under
a growing load faster and faster, where a line over a minute lags far behind (the twin's ramps:
the line said 63 s with 25 s left). So where a quadratic through the last `CURVE_WINDOW_S`
leaves at most `CURVE_GAIN` of a line's squared residuals there, and bends up, the forecast
runs that curve (lifted by its own spread) to 100% instead. A small cache's swings hide any
curve, so there the line stays: on the fixture's 93 recorded runs every figure but one lead
time is what it was. Chosen on the twin's three even ramps; its Poisson ramps are held out
(docs/detection.md).

`free tokens / generation rate`, the signal kvwatch had before, assumed that nothing finishes: it
said "3 s" on every busy run, 76-86% off (bench/bench_forecast.py, docs/detection.md). The window
and the lift were chosen on four ramps recorded on the real fixture. On the ramps recorded after
the choice it is 21% and 18% off 10 s out where the server ran without stalls (two batches of
ten), 48% where the machine stalled it for seconds: a figure to warn on, once it counts down
(sidecar/judge/pipeline.py), and a rough one to plan by.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "CURVE_GAIN", "CURVE_WINDOW_S", "MIN_POINTS", "SPREAD_K", "WINDOW_S", "KvForecast",
    "forecast_exhaustion", "least_squares", "line_fit", "quadratic_fit",
]  # fmt: skip

WINDOW_S = 60.0
SPREAD_K = 1.5
# a curve replaces the line when it leaves at most this share of the line's squared residuals
# over the last CURVE_WINDOW_S
CURVE_GAIN = 0.25
CURVE_WINDOW_S = 30.0
MIN_POINTS = 6  # fewer points than this fit any line


@dataclass(frozen=True)
class KvForecast:
    seconds: float | None  # until the band reaches 100%; None while usage is not rising
    trend_per_s: float  # the fitted line's slope (KV usage per second)
    band_now: float  # the line at now, plus SPREAD_K times the spread around it
    curved: bool = False  # the curve ran it (usage rose smoothly, faster and faster)


def line_fit(pts: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares line through (t, value) points: (slope, mean t, mean value). A slope of 0
    when every point has the same time."""
    mt = statistics.fmean(t for t, _ in pts)
    mv = statistics.fmean(v for _, v in pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (v - mv) for t, v in pts) / var if var else 0.0
    return slope, mt, mv


def forecast_exhaustion(
    usage: Sequence[tuple[float, float]],
    now: float,
    window_s: float = WINDOW_S,
    spread_k: float = SPREAD_K,
) -> KvForecast | None:
    """`usage`: (monotonic seconds, KV usage 0..1) in time order. None with fewer than
    MIN_POINTS inside the window."""
    pts = [(t, u) for t, u in usage if now - window_s <= t <= now and math.isfinite(u)]
    if len(pts) < MIN_POINTS:
        return None
    slope, mt, mv = line_fit(pts)
    spread = _rms(pts, lambda t: mv + slope * (t - mt))
    recent = [(t, v) for t, v in pts if t >= now - CURVE_WINDOW_S]
    curve = _curve(recent, now, spread_k) if len(recent) >= MIN_POINTS else None
    if curve is not None:
        return curve
    band = mv + slope * (now - mt) + spread_k * spread
    if band >= 1.0:
        return KvForecast(0.0, slope, band)
    if slope <= 0:
        return KvForecast(None, slope, band)
    return KvForecast((1.0 - band) / slope, slope, band)


def _rms(pts: Sequence[tuple[float, float]], fit: Callable[[float], float]) -> float:
    """The residuals' root mean square around a fit, in floats (statistics.pstdev is exact,
    and slow)."""
    return math.sqrt(sum((v - fit(t)) ** 2 for t, v in pts) / len(pts))


def quadratic_fit(pts: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares `a + b t + c t^2` through (t, value) points, t as given: (a, b, c); None
    when the points cannot fix a curve (fewer than three distinct times)."""
    if len({t for t, _ in pts}) < 3:
        return None
    got = least_squares([(1.0, t, t * t) for t, _ in pts], [v for _, v in pts])
    return None if got is None else (got[0], got[1], got[2])


def least_squares(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float] | None:
    """The coefficients of `ys` on the columns of `xs` (a few unknowns): the normal equations
    solved by elimination with partial pivoting; None where they are singular."""
    k = len(xs[0])
    a = [
        [sum(r[i] * r[j] for r in xs) for j in range(k)]
        + [sum(r[i] * y for r, y in zip(xs, ys, strict=True))]
        for i in range(k)
    ]
    scale = max(1.0, max(abs(v) for row in a for v in row[:k]))
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(a[r][c]))
        if abs(a[piv][c]) < 1e-12 * scale:
            return None
        a[c], a[piv] = a[piv], a[c]
        for r in range(k):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    return [a[i][k] / a[i][i] for i in range(k)]


def _curve(pts: Sequence[tuple[float, float]], now: float, spread_k: float) -> KvForecast | None:
    """Where usage rises smoothly and faster and faster (a big cache under a growing load),
    the curve through it, lifted by its own spread and run forward to 100%; None where a line
    serves (a small cache's swings hide any curve: it leaves them nearly as they are)."""
    slope, mt, mv = line_fit(pts)
    line_spread = _rms(pts, lambda t: mv + slope * (t - mt))
    if line_spread <= 0:
        return None  # on a line: the line serves
    q = quadratic_fit([(t - now, v) for t, v in pts])  # t = 0 now, so a is the curve's level
    if q is None:
        return None
    a, b, c = q
    if c <= 0 or b <= 0:
        return None
    spread = _rms(pts, lambda t: a + b * (t - now) + c * (t - now) ** 2)
    if spread * spread > CURVE_GAIN * line_spread * line_spread:
        return None
    band = a + spread_k * spread
    if band >= 1.0:
        return KvForecast(0.0, b, band, curved=True)
    # a + k s + b x + c x^2 = 1: the positive root
    seconds = (-b + math.sqrt(b * b + 4 * c * (1.0 - band))) / (2 * c)
    return KvForecast(seconds, b, band, curved=True)
