"""Start a real Prometheus (Debian's) on 127.0.0.1 with a temporary config and data dir, its
targets given up front or discovered from files (`file_sd_configs`) that the caller rewrites as
replicas come and go, as Kubernetes' discovery would."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kvwatch.common.promql import prometheus_query
from kvwatch.fleet.services import running_service

__all__ = ["running_prometheus", "wait_for_series", "query", "write_file_sd"]


def write_file_sd(path: Path, targets: list[str], labels: dict[str, str] | None = None) -> None:
    """Write a file-discovery target list atomically (Prometheus rereads it on change)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": targets, "labels": labels or {}}]))
    tmp.replace(path)


@contextmanager
def running_prometheus(
    targets: dict[str, list[str]],
    interval: str = "1s",
    rules: str | None = None,
    alertmanager: str | None = None,
    rename: tuple[str, str] | None = None,
    discovered: dict[str, Path] | None = None,
) -> Iterator[str]:
    """`targets` maps a job name to host:port addresses; `discovered` a job name to a
    file-discovery JSON file (`write_file_sd`) reread every second; `rules` is a rules file's
    text; `alertmanager` a host:port; `rename` a (regex, replacement) applied to every scraped
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
    jobs += "".join(
        f"  - job_name: {job}\n    scrape_interval: {interval}\n"
        f"    file_sd_configs:\n      - files: [{str(path)!r}]\n        refresh_interval: 1s\n"
        f"{relabel}"
        for job, path in (discovered or {}).items()
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


def query(url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result rows, on a connection of its own (common/promql.py's reader:
    PrometheusUnreachable when it cannot be read, PrometheusError when refused)."""
    with httpx.Client(timeout=10) as client:
        return prometheus_query(client, url, promql, at)


def wait_for_series(url: str, promql: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = query(url, promql)
        if rows:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"no data for {promql} after {timeout} s")
