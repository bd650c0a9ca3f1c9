"""Start a real Prometheus (Debian's) on 127.0.0.1 with a temporary config and data dir."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.services import running_service

__all__ = ["running_prometheus", "wait_for_series"]


@contextmanager
def running_prometheus(
    targets: dict[str, list[str]],
    interval: str = "1s",
    rules: str | None = None,
    alertmanager: str | None = None,
    rename: tuple[str, str] | None = None,
) -> Iterator[str]:
    """`targets` maps a job name to host:port addresses; `rules` is a rules file's text;
    `alertmanager` a host:port; `rename` a (regex, replacement) applied to every scraped
    metric name (to store the other vLLM spelling). Stops the process by its PID."""
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-prom-"))
    extra = ""
    if rules is not None:
        (tmp / "rules.yaml").write_text(rules)
        extra += f"rule_files: [{str(tmp / 'rules.yaml')!r}]\n"
    if alertmanager is not None:
        extra += (
            "alerting:\n  alertmanagers:\n    - static_configs:\n"
            f"        - targets: [{alertmanager!r}]\n"
        )
    relabel = ""
    if rename is not None:
        relabel = (
            "    metric_relabel_configs:\n      - source_labels: [__name__]\n"
            f"        regex: {rename[0]!r}\n        target_label: __name__\n"
            f"        replacement: {rename[1]!r}\n"
        )
    jobs = "".join(
        f"  - job_name: {job}\n    scrape_interval: {interval}\n"
        f"    static_configs:\n      - targets: [{', '.join(repr(a) for a in addrs)}]\n"
        f"{relabel}"
        for job, addrs in targets.items()
    )
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"{extra}scrape_configs:\n{jobs}"
    )
    with running_service(
        "prometheus",
        tmp,
        lambda port: [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    ) as url:
        yield url


def wait_for_series(url: str, promql: str, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=5).json()
        if r["data"]["result"]:
            return list(r["data"]["result"])
        time.sleep(0.5)
    raise AssertionError(f"no data for {promql} after {timeout} s")


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
