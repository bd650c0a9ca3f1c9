"""When will the KV cache run out? The forecast behind `kvwatch_seconds_to_kv_exhaustion`.

Under load KV usage swings by a request's worth of blocks as requests are admitted and finish,
and vLLM preempts at the first swing that finds no block free: at a peak, not at the mean. So the
forecast follows the band the peaks live in: a least-squares line through KV usage over the last
`WINDOW_S`, lifted by `SPREAD_K` times the spread of the points around it. The forecast is the
time until that band reaches 100%; none while the line is flat or falling (a steady load,
however busy, is not heading for exhaustion), 0 once the band is already there.

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
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_POINTS", "SPREAD_K", "WINDOW_S", "KvForecast", "forecast_exhaustion", "line_fit"]

WINDOW_S = 60.0
SPREAD_K = 1.5
MIN_POINTS = 6  # fewer points than this fit any line


@dataclass(frozen=True)
class KvForecast:
    seconds: float | None  # until the band reaches 100%; None while usage is not rising
    trend_per_s: float  # the fitted line's slope (KV usage per second)
    band_now: float  # the line at now, plus SPREAD_K times the spread around it


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
    # the residuals' root mean square, in floats (statistics.pstdev is exact, and slow)
    spread = math.sqrt(sum((v - (mv + slope * (t - mt))) ** 2 for t, v in pts) / len(pts))
    band = mv + slope * (now - mt) + spread_k * spread
    if band >= 1.0:
        return KvForecast(0.0, slope, band)
    if slope <= 0:
        return KvForecast(None, slope, band)
    return KvForecast((1.0 - band) / slope, slope, band)
