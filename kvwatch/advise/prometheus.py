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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError
from kvwatch.common.promql import (
    PrometheusError,
    PrometheusUnreachable,
    labels_of,
    prometheus_query,
    values_by_labels,
)
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

__all__ = ["observed_from_prometheus", "prometheus_as_cli"]

_BY = "instance, engine"


@contextmanager
def prometheus_as_cli() -> Iterator[None]:
    """The PromQL reader's errors as a command's: unreachable is exit 3, as for every other
    source; a refused or unreadable answer is bad input (exit 2)."""
    try:
        yield
    except PrometheusUnreachable as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    except PrometheusError as e:
        raise CliError(str(e)) from None


def _engine_key(labels: dict[str, Any]) -> tuple[str, str]:
    return str(labels.get("instance", "")), str(labels.get("engine", ""))


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
    keys = [_engine_key(labels_of(r)) for r in caches]
    refused = per_first_engine(refused, keys)
    out = []
    for row in caches:
        m = labels_of(row)
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
