"""Prometheus scraping a vLLM and its sidecar with kvwatch's rules, for the alerting tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvwatch.fleet.prometheus import running_prometheus, wait_for_series

__all__ = ["prometheus_alerting", "running_prometheus", "wait_for_series"]


@contextmanager
def prometheus_alerting(
    vllm_base: str, sidecar: str, alertmanager: str, for_scale: float = 0.02
) -> Iterator[str]:
    """Prometheus scraping vLLM and a sidecar with kvwatch's rules (their `for:` scaled) and
    sending to Alertmanager; yields once both targets have data."""
    from kvwatch.alerts.build import render_rules

    targets = {
        "vllm": [vllm_base.removeprefix("http://")],
        "kvwatch": [sidecar.removeprefix("http://")],
    }
    with running_prometheus(
        targets,
        rules=render_rules(for_scale=for_scale),
        alertmanager=alertmanager.removeprefix("http://"),
    ) as prom:
        wait_for_series(prom, 'up{job="kvwatch"} == 1')
        wait_for_series(prom, '{__name__=~"vllm[:_]kv_cache_usage_perc"}')
        yield prom
