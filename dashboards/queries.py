"""PromQL for the dashboards, as functions of the sidecar's vocabulary.

Every vLLM selector matches both the `vllm:` and the `vllm_` spelling (`{__name__=~"vllm[:_]..."}`),
so a Prometheus that stored either one fills the panels. Selectors carry the dashboard's template
variables; `kvwatch_*` series come from the sidecar, whose own `instance` is not vLLM's, so they
are filtered by model and engine only. Layout lives in dashboards/build.py.
"""

from __future__ import annotations

from kvwatch.sidecar.contract.catalogue import STALL_SECONDS_OBSERVED, STATE_LEVEL, Metric
from kvwatch.sidecar.contract.vocabulary import (
    ADMISSION_REJECTIONS,
    KV_OFFLOAD_ALLOCATION_FAILURES,
    KV_OFFLOAD_LOAD_BYTES,
    KV_OFFLOAD_STORE_BYTES,
    KV_OFFLOAD_TRANSFER_BYTES,
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS_BY_SOURCE,
    REQUEST_PREEMPTIONS,
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    Family,
    promql_selector,
)

__all__ = [
    "VLLM_FILTER", "SIDECAR_FILTER", "BY", "vllm", "sidecar", "kv_usage", "preemption_rate",
    "running", "waiting", "waiting_by_reason", "token_rate", "latency_quantile",
    "preemptions_per_request", "state_level", "label_values", "QUANTILES", "MODEL_FILTER",
    "prompt_tokens_by_source", "admission_rejections", "offload_bytes", "offload_failures",
    "sidecar_gauge", "sidecar_curve", "stall_seconds_rate",
]  # fmt: skip

VLLM_FILTER = 'model_name=~"$model_name", instance=~"$instance", engine=~"$engine"'
SIDECAR_FILTER = 'model_name=~"$model_name", engine=~"$engine"'
# vLLM's API server counts admission rejections per model: no engine label to filter on
MODEL_FILTER = 'model_name=~"$model_name", instance=~"$instance"'
BY = "instance, model_name, engine"
QUANTILES = (0.5, 0.9, 0.99)


def vllm(family: Family, suffix: str = "", matchers: str = VLLM_FILTER) -> str:
    return promql_selector(family, matchers, suffix)


def sidecar(metric: Metric, matchers: str = SIDECAR_FILTER) -> str:
    return metric.select(matchers)


def kv_usage(matchers: str = VLLM_FILTER) -> str:
    return f"max by ({BY}) ({vllm(KV_USAGE, matchers=matchers)})"


def preemption_rate(matchers: str = VLLM_FILTER, window: str = "$__rate_interval") -> str:
    return f"sum by ({BY}) (rate({vllm(PREEMPTIONS, matchers=matchers)}[{window}]))"


def running(matchers: str = VLLM_FILTER) -> str:
    return f"sum by ({BY}) ({vllm(RUNNING, matchers=matchers)})"


def waiting(matchers: str = VLLM_FILTER) -> str:
    return f"sum by ({BY}) ({vllm(WAITING, matchers=matchers)})"


def waiting_by_reason() -> str:
    """vLLM 0.20+ splits the queue: `capacity` holds preempted requests waiting for blocks."""
    return f"sum by ({BY}, reason) ({vllm(WAITING_BY_REASON)})"


def token_rate(family: Family) -> str:
    return f"sum by ({BY}) (rate({vllm(family)}[$__rate_interval]))"


def latency_quantile(family: Family, q: float) -> str:
    bucket = vllm(family, "bucket")
    return f"histogram_quantile({q}, sum by ({BY}, le) (rate({bucket}[$__rate_interval])))"


def preemptions_per_request() -> str:
    """Finished requests per bucket of the preemption histogram over the dashboard's range;
    the panel's heatmap format turns the cumulative buckets into counts per bucket."""
    return f"sum by (le) (increase({vllm(REQUEST_PREEMPTIONS, 'bucket')}[$__range]))"


def state_level(matchers: str = SIDECAR_FILTER) -> str:
    return f"max by (model_name, engine) ({sidecar(STATE_LEVEL, matchers)})"


def label_values(label: str, matchers: str = "") -> str:
    """A Grafana variable query: the label's values on vLLM's KV usage series."""
    return f"label_values({vllm(KV_USAGE, matchers=matchers)}, {label})"


def prompt_tokens_by_source() -> str:
    """Prompt tokens per second by where their KV came from (computed, prefix cache, connector)."""
    return f"sum by ({BY}, source) (rate({vllm(PROMPT_TOKENS_BY_SOURCE)}[$__rate_interval]))"


def admission_rejections() -> str:
    sel = vllm(ADMISSION_REJECTIONS, matchers=MODEL_FILTER)
    return f"sum by (instance, model_name, reason) (rate({sel}[$__rate_interval]))"


def offload_bytes(direction: str) -> str:
    """Bytes per second to (`store`) or from (`load`) the CPU tier, in either spelling: the flat
    family, or the older total by transfer_type (0.33 writes both: the flat one wins)."""
    flat = vllm(KV_OFFLOAD_STORE_BYTES if direction == "store" else KV_OFFLOAD_LOAD_BYTES)
    transfer = "GPU_to_CPU" if direction == "store" else "CPU_to_GPU"
    legacy = vllm(KV_OFFLOAD_TRANSFER_BYTES, matchers=f'{VLLM_FILTER}, transfer_type="{transfer}"')
    return (
        f"sum by ({BY}) (rate({flat}[$__rate_interval])) or "
        f"sum by ({BY}) (rate({legacy}[$__rate_interval]))"
    )


def offload_failures() -> str:
    sel = vllm(KV_OFFLOAD_ALLOCATION_FAILURES)
    return f"sum by ({BY}) (increase({sel}[$__rate_interval]))"


def stall_seconds_rate(matchers: str = SIDECAR_FILTER) -> str:
    """Seconds of stall per second, by the cause the sidecar read from the server's side."""
    sel = sidecar(STALL_SECONDS_OBSERVED, matchers)
    return f"sum by (model_name, engine, cause) (rate({sel}[$__rate_interval]))"


def sidecar_curve(metric: Metric, matchers: str = SIDECAR_FILTER) -> str:
    """A sidecar gauge with a point per cache size (the prefix cache's curve)."""
    return f"max by (target, model_name, engine, blocks, factor) ({sidecar(metric, matchers)})"


def sidecar_gauge(metric: Metric, matchers: str = SIDECAR_FILTER) -> str:
    """A sidecar gauge per engine (one sidecar per server: the max over duplicates)."""
    return f"max by (target, model_name, engine) ({sidecar(metric, matchers)})"
