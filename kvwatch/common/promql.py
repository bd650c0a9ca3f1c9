"""Read PromQL answers from a Prometheus server: the one reader the advice, the calibration,
the fleet and its lab share.

An answer is input from outside: it is read within one deadline and a size limit
(common/http_read.py), a refusal or a body that is no result is a `PrometheusError` (one line),
an unreachable or too slow server a `PrometheusUnreachable` (a `ReadError`: the commands' exit
3), and a sample that is no finite number is left out, never raised. Pure of any room: the
callers turn the errors into their own exits.
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from kvwatch.common.cli_kit import one_line
from kvwatch.common.http_read import ReadError, get_json

__all__ = [
    "PrometheusError", "PrometheusUnreachable", "prometheus_query", "prometheus_range",
    "labels_of", "values_by", "values_by_labels", "series_by", "series_by_labels", "value_at",
]  # fmt: skip


class PrometheusError(ValueError):
    """Prometheus refused a query, or answered what is no result; the message is one line."""


class PrometheusUnreachable(ReadError):
    """Prometheus could not be read (unreachable, too slow, too much); names its URL."""


# one deadline per query for the whole answer: a server sending a byte a second held advise
# for as long as it liked
READ_DEADLINE_S = 60.0


def _api(client: httpx.Client, base: str, path: str, params: dict[str, Any]) -> list[Any]:
    try:
        body = get_json(client, base.rstrip("/") + path, params=params,
                        deadline_s=READ_DEADLINE_S).body  # fmt: skip
    except ReadError as e:
        raise PrometheusUnreachable(f"cannot read Prometheus at {base}: {e}") from None
    except ValueError:
        raise PrometheusError(f"Prometheus at {base} answered a query with no JSON") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        why = one_line(str(error))[:300]
        raise PrometheusError(f"Prometheus rejected {params['query']!r}: {why}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus at {base} answered {params['query']!r} without a result")
    return [row for row in result if isinstance(row, dict)]


def prometheus_query(
    client: httpx.Client, base: str, promql: str, at: float | None = None
) -> list[dict[str, Any]]:
    """An instant query's rows (now, or at unix time `at`); PrometheusUnreachable if it cannot
    be read in time, PrometheusError if refused or unreadable."""
    params: dict[str, Any] = {"query": promql}
    if at is not None:
        params["time"] = at
    return _api(client, base, "/api/v1/query", params)


def prometheus_range(
    client: httpx.Client, base: str, promql: str, start: float, end: float, step_s: float
) -> list[dict[str, Any]]:
    """A range query's series (each with `values`), errors as prometheus_query's."""
    params = {"query": promql, "start": start, "end": end, "step": step_s}
    return _api(client, base, "/api/v1/query_range", params)


def _number(raw: Any) -> float | None:
    """A sample's value; None for NaN (a ratio with no traffic) and infinities (a quantile
    past the last bucket says no length)."""
    try:
        v = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def labels_of(row: dict[str, Any]) -> dict[str, Any]:
    """A result row's labels ({} where it has none that read as labels)."""
    m = row.get("metric")
    return m if isinstance(m, dict) else {}


def values_by_labels(
    rows: list[dict[str, Any]], labels: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """Each instant row's value keyed by the tuple of these labels ('' where one is absent);
    rows without a readable, non-NaN value are left out."""
    out = {}
    for row in rows:
        value = row.get("value")
        v = _number(value[1]) if isinstance(value, list) and len(value) == 2 else None
        if v is not None:
            m = labels_of(row)
            out[tuple(str(m.get(label, "")) for label in labels)] = v
    return out


def values_by(rows: list[dict[str, Any]], label: str) -> dict[str, float]:
    """values_by_labels keyed by one label's value."""
    return {key[0]: v for key, v in values_by_labels(rows, (label,)).items()}


def series_by(rows: list[dict[str, Any]], label: str) -> dict[str, dict[float, float]]:
    """A range query's series keyed by one label: {label value: {unix time: value}}."""
    return {key[0]: v for key, v in series_by_labels(rows, (label,)).items()}


def series_by_labels(
    rows: list[dict[str, Any]], labels: tuple[str, ...]
) -> dict[tuple[str, ...], dict[float, float]]:
    """A range query's series keyed by the tuple of these labels ('' where one is absent):
    {key: {unix time: value}}; points without a readable, finite value are left out."""
    out: dict[tuple[str, ...], dict[float, float]] = {}
    for row in rows:
        m = labels_of(row)
        points = out.setdefault(tuple(str(m.get(label, "")) for label in labels), {})
        values = row.get("values")
        for pair in values if isinstance(values, list) else []:
            t, v = pair if isinstance(pair, list) and len(pair) == 2 else (None, None)
            t, v = _number(t), _number(v)
            if t is not None and v is not None:
                points[t] = v
    return out


def value_at(points: dict[float, float], t: float) -> float | None:
    """A range series' value at t, or at its last point before t (a series can miss a step:
    a late scrape, a rule evaluated late); None if it has none by then."""
    if t in points:
        return points[t]
    before = [u for u in points if u <= t]
    return points[max(before)] if before else None
