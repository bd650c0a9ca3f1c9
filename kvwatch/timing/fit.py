"""Fit named positive constants to measurements: least squares of log ratios, Nelder-Mead.

The step model's constants are all positive and act multiplicatively, so the fit runs in log
space (a constant cannot turn negative, and 10% too slow weighs as 10% too fast), and minimises
the sum of squared log(predicted / measured). Nelder-Mead needs no derivatives, which the step
model (maxima of memory and compute) does not have everywhere. Bounds keep a constant within
what is physical; a constant pinned at a bound is reported, since the data did not decide it.
Pure: the caller's `predict(constants)` returns one prediction per measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Bound", "FitResult", "fit", "errors", "summary"]


@dataclass(frozen=True)
class Bound:
    name: str
    start: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.start <= self.high:
            raise ValueError(f"{self.name}: need 0 < low <= start <= high")


@dataclass(frozen=True)
class FitResult:
    values: dict[str, float]
    rms_log_error: float  # root mean square of log(predicted / measured)
    iterations: int
    at_bound: tuple[str, ...]  # constants the data pushed to a bound


def _loss(residuals: Sequence[float], robust: float | None = None) -> float:
    """Mean squared residual; with `robust` = s, soft-L1 (quadratic within s, then linear), so
    a few figures the model cannot carry do not pull every constant toward them."""
    if robust:
        s2 = robust * robust
        return sum(2 * s2 * (math.sqrt(1 + r * r / s2) - 1) for r in residuals) / max(
            1, len(residuals)
        )
    return sum(r * r for r in residuals) / max(1, len(residuals))


def fit(
    bounds: Sequence[Bound],
    predict: Callable[[dict[str, float]], Sequence[float]],
    measured: Sequence[float],
    max_iterations: int = 400,
    robust: float | None = None,
) -> FitResult:
    """The constants within their bounds that bring `predict` closest to `measured`."""
    if any(m <= 0 or not math.isfinite(m) for m in measured):
        raise ValueError("measurements must be positive and finite")
    logs_lo = [math.log(b.low) for b in bounds]
    logs_hi = [math.log(b.high) for b in bounds]

    def values(x: Sequence[float]) -> dict[str, float]:
        return {
            b.name: math.exp(min(hi, max(lo, v)))
            for b, v, lo, hi in zip(bounds, x, logs_lo, logs_hi, strict=True)
        }

    def cost(x: Sequence[float]) -> float:
        pred = predict(values(x))
        res = [math.log(p / m) if p > 0 else 50.0 for p, m in zip(pred, measured, strict=True)]
        # outside the bounds the constant is clamped; a penalty keeps the simplex inside
        out = sum(
            max(0.0, lo - v) + max(0.0, v - hi)
            for v, lo, hi in zip(x, logs_lo, logs_hi, strict=True)
        )
        return _loss(res, robust) + out * out

    start = [math.log(b.start) for b in bounds]
    best, n_iter = _nelder_mead(cost, start, max_iterations)
    vals = values(best)
    at_bound = tuple(
        b.name
        for b, v, lo, hi in zip(bounds, best, logs_lo, logs_hi, strict=True)
        if v <= lo + 1e-3 or v >= hi - 1e-3
    )
    pred = predict(vals)
    rms = math.sqrt(_loss([math.log(p / m) for p, m in zip(pred, measured, strict=True)]))
    return FitResult(vals, rms, n_iter, at_bound)


def _nelder_mead(
    f: Callable[[Sequence[float]], float], x0: Sequence[float], max_iterations: int
) -> tuple[list[float], int]:
    n = len(x0)
    if n == 0:
        return [], 0
    simplex = [list(x0)]
    for i in range(n):
        x = list(x0)
        x[i] += 0.3  # a 35% step in each constant
        simplex.append(x)
    scores = [f(x) for x in simplex]
    it = 0
    for it in range(1, max_iterations + 1):  # noqa: B007 (the count is returned)
        order = sorted(range(n + 1), key=lambda k: scores[k])
        simplex = [simplex[k] for k in order]
        scores = [scores[k] for k in order]
        if scores[-1] - scores[0] < 1e-12:
            break
        centroid = [sum(x[i] for x in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]

        def toward(t: float, c: list[float] = centroid, w: list[float] = worst) -> list[float]:
            return [ci + t * (ci - wi) for ci, wi in zip(c, w, strict=True)]

        refl = toward(1.0)
        fr = f(refl)
        if fr < scores[0]:
            exp = toward(2.0)
            fe = f(exp)
            simplex[-1], scores[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < scores[-2]:
            simplex[-1], scores[-1] = refl, fr
        else:
            con = toward(-0.5)
            fc = f(con)
            if fc < scores[-1]:
                simplex[-1], scores[-1] = con, fc
            else:  # shrink toward the best
                b = simplex[0]
                simplex = [b] + [
                    [bi + 0.5 * (xi - bi) for bi, xi in zip(b, x, strict=True)] for x in simplex[1:]
                ]
                scores = [scores[0]] + [f(x) for x in simplex[1:]]
    k = min(range(n + 1), key=lambda j: scores[j])
    return simplex[k], it


def errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """Signed relative errors, (predicted - measured) / measured."""
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]


def summary(errs: Sequence[float]) -> dict[str, float]:
    """Median and largest absolute error, mean signed error, the count."""
    if not errs:
        return {"n": 0, "median_abs": math.nan, "max_abs": math.nan, "mean": math.nan}
    a = sorted(abs(e) for e in errs)
    mid = len(a) // 2
    median = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return {"n": len(errs), "median_abs": median, "max_abs": a[-1], "mean": sum(errs) / len(errs)}
