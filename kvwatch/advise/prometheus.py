"""Read what advice needs from a Prometheus server, for every vLLM instance it scrapes.

Every selector matches both spellings (`vllm:` and `vllm_`, see sidecar/contract/vocabulary.py). Per
(instance, engine): the cache configuration, the most requests held at once over the window
(running + waiting), the p95 request lengths from vLLM's per-request histograms, and the
preemptions in the window. From the families vLLM 0.32+ exports, where the server has them: the
prompt tokens served from a cache, the CPU tier's refused stores, and the requests refused at
the queue limits (counted per model by the API server: booked on the instance's first engine,
as the sidecar does, so a data-parallel server does not count them once per engine).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError, one_line
from kvwatch.common.http_read import ReadError, get_json
from kvwatch.sidecar.contract.vocabulary import (
    ADMISSION_REJECTIONS,
    CACHE_CONFIG,
    KV_OFFLOAD_ALLOCATION_FAILURES,
    PREEMPTIONS,
    PROMPT_TOKENS_BY_SOURCE,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PROMPT_TOKENS,
    RUNNING,
    WAITING,
    promql_selector,
)
from kvwatch.sidecar.judge.signals import cached_share
from kvwatch.sidecar.metrics.observe import per_first_engine
from kvwatch.sizing.advice import Observed
from kvwatch.sizing.errors import SizingError

__all__ = [
    "observed_from_prometheus", "prometheus_query", "prometheus_range", "values_by",
    "values_by_labels", "series_by", "series_by_labels", "value_at",
]  # fmt: skip

_BY = "instance, engine"


# one deadline per query for the whole answer: a server sending a byte a second held advise
# for as long as it liked
READ_DEADLINE_S = 60.0


def _api(client: httpx.Client, base: str, path: str, params: dict[str, Any]) -> list[Any]:
    try:
        body = get_json(client, base.rstrip("/") + path, params=params,
                        deadline_s=READ_DEADLINE_S).body  # fmt: skip
    except ReadError as e:  # as every other source: unreachable (or too slow) is exit 3
        raise CliError(f"cannot read Prometheus at {base}: {e}", EXIT_UNREACHABLE) from None
    except ValueError:
        raise SizingError(f"Prometheus at {base} answered a query with no JSON") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise SizingError(f"Prometheus rejected {params['query']!r}: {one_line(str(error))[:300]}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise SizingError(f"Prometheus at {base} answered {params['query']!r} without a result")
    return [row for row in result if isinstance(row, dict)]


def prometheus_query(
    client: httpx.Client, base: str, promql: str, at: float | None = None
) -> list[dict[str, Any]]:
    """An instant query's rows (now, or at unix time `at`); CliError (exit 3) if unreachable,
    SizingError if refused."""
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


def _engine_key(labels: dict[str, Any]) -> tuple[str, str]:
    return str(labels.get("instance", "")), str(labels.get("engine", ""))


def _labels(row: dict[str, Any]) -> dict[str, Any]:
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
            m = _labels(row)
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
        m = _labels(row)
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


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(k[0], k[1]): v for k, v in values_by_labels(rows, ("instance", "engine")).items()}


def _quantile(fam_sel: str, window: str) -> str:
    return f"histogram_quantile(0.95, sum by ({_BY}, le) (increase({fam_sel}[{window}])))"


def _increase(selector: str, window: str, by: str = _BY) -> str:
    return f"sum by ({by}) (increase({selector}[{window}]))"


def _growth(selector: str, window: str, by: str = _BY) -> str:
    """The rise of a counter whose series are born at their first count (vLLM's labelled
    refusal counters): `increase()` misses that first count (a new series' first sample is
    its base), so a burst of refusals in one scrape would read 0. Now's value less the one
    `window` ago, or less 0 for a series that did not exist then. A restart in the window
    counts as no rise (the difference is clamped at 0)."""
    return (
        f"sum by ({by}) (clamp_min({selector} - ({selector} offset {window} or {selector} * 0), 0))"
    )


def observed_from_prometheus(
    base: str, window: str = "1h", step: str = "15s", transport: httpx.BaseTransport | None = None
) -> list[tuple[str, Observed]]:
    """`step` is the subquery resolution for the peak of running + waiting: at most the scrape
    interval, or short peaks fall between the points. `transport`: httpx's (the fuzz tests
    answer from one in the process)."""
    with httpx.Client(timeout=30, transport=transport) as client:
        caches = prometheus_query(
            client,
            base,
            f"max by ({_BY}, num_gpu_blocks, block_size, "
            f"kv_cache_memory_bytes, gpu_memory_utilization, cache_dtype, kv_offloading_size, "
            f"mamba_ssm_cache_dtype) "
            f"({promql_selector(CACHE_CONFIG)})",
        )
        demand = _by_key(
            prometheus_query(
                client,
                base,
                (
                    f"max_over_time((sum by ({_BY}) ({promql_selector(RUNNING)}) + sum by ({_BY}) "
                    f"({promql_selector(WAITING)}))[{window}:{step}])"
                ),
            )
        )
        prompt = _by_key(
            prometheus_query(
                client,
                base,
                _quantile(promql_selector(REQUEST_PROMPT_TOKENS, suffix="bucket"), window),
            )
        )
        output = _by_key(
            prometheus_query(
                client,
                base,
                _quantile(promql_selector(REQUEST_GENERATION_TOKENS, suffix="bucket"), window),
            )
        )
        preempt = _by_key(
            prometheus_query(client, base, _increase(promql_selector(PREEMPTIONS), window))
        )

        def prompt_tokens(sources: str) -> dict[tuple[str, str], float]:
            selector = promql_selector(PROMPT_TOKENS_BY_SOURCE, f'source=~"{sources}"')
            return _by_key(prometheus_query(client, base, _increase(selector, window)))

        # as the sidecar reads them (sidecar/metrics/observe.py): a connector's transfer is a cache
        # too
        cached = prompt_tokens("local_cache_hit|external_kv_transfer")
        computed = prompt_tokens("local_compute")
        refused_stores = _by_key(
            prometheus_query(
                client, base, _growth(promql_selector(KV_OFFLOAD_ALLOCATION_FAILURES), window)
            )
        )
        refused = _by_key(
            prometheus_query(
                client, base, _growth(promql_selector(ADMISSION_REJECTIONS), window, "instance")
            )
        )
    # rows as Prometheus gives them, or not: a row without a `metric` object has no labels
    keys = [_engine_key(_labels(r)) for r in caches]
    refused = per_first_engine(refused, keys)
    out = []
    for row in caches:
        m = _labels(row)
        key = _engine_key(m)
        name = f"{key[0]} engine {key[1]}"
        try:
            blocks, bs = int(float(m["num_gpu_blocks"])), int(float(m["block_size"]))
            mem = float(m["kv_cache_memory_bytes"])
            if blocks < 1 or bs < 1 or not 0 < mem < math.inf:
                raise ValueError
        except (KeyError, TypeError, ValueError, OverflowError):
            raise SizingError(
                f"{name}: cache_config_info lacks num_gpu_blocks, block_size or "
                "kv_cache_memory_bytes (or says 0 of them)"
            ) from None
        if key not in prompt or key not in output:
            raise SizingError(f"{name}: no finished requests in the last {window}")
        p95 = prompt[key] + output[key]
        if not math.isfinite(p95):  # each finite, their sum past a float
            raise SizingError(f"{name}: request lengths of {p95} tokens are no figures")
        out.append(
            (
                name,
                Observed(
                    capacity_blocks=blocks,
                    block_size=bs,
                    kv_bytes_per_token=mem / (blocks * bs),
                    peak_demand=demand.get(key, 0.0),
                    seq_len_p95=p95,
                    seq_len_max=p95,
                    preemptions=preempt.get(key, 0.0),
                    gpu_memory_utilization=_opt_float(m.get("gpu_memory_utilization")),
                    kv_cache_memory_bytes=mem,
                    kv_dtype=_opt_text(m.get("cache_dtype")) or "auto",
                    ssm_state_dtype=_opt_text(m.get("mamba_ssm_cache_dtype")),
                    source=f"prometheus {base}",
                    admission_rejections=refused.get(key),
                    offload_allocation_failures=refused_stores.get(key),
                    kv_offloading_gib=_opt_float(m.get("kv_offloading_size")),
                    prompt_cache_hit_share=cached_share(cached.get(key), computed.get(key)),
                ),
            )
        )
    if not out:
        raise SizingError(f"Prometheus at {base} has no vllm cache_config_info series")
    return out


def _opt_float(raw: Any) -> float | None:
    """A label's number; None where it is absent, not a number, or not finite."""
    try:
        v = None if raw is None else float(raw)
    except (TypeError, ValueError):
        return None
    return v if v is not None and math.isfinite(v) else None


def _opt_text(raw: Any) -> str | None:
    return raw if isinstance(raw, str) and raw else None
