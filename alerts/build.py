"""Prometheus recording and alerting rules, rendered from the vocabulary and the thresholds.

Every selector matches both the `vllm:` and the `vllm_` spelling; the preemption rule uses the
`_total` counter that vLLM really exposes (rules that query `vllm:num_preemptions` never fire).
Thresholds come from sidecar/thresholds.py, the same the sidecar judges by, and are written into
the annotations too, so "above 90%" cannot drift from `> 0.9`. `kvwatch alerts` writes the files;
a test fails if the checked-in files differ from what this renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvwatch.sidecar.thresholds import DEFAULT_THRESHOLDS, Thresholds
from kvwatch.sidecar.vocabulary import (
    KV_USAGE,
    PREEMPTIONS,
    REQUEST_PREEMPTIONS,
    RUNNING,
    WAITING,
    promql_selector,
)

__all__ = ["rule_groups", "render_rules", "render_prometheus_rule", "write_all", "ALERT_NAMES"]

_BY = "instance, model_name, engine"
RULES_FILE = "kvwatch-rules.yaml"
K8S_FILE = "kvwatch-prometheusrule.yaml"


# Every alert about one vLLM server carries `vllm_instance`: that server's host:port as
# Prometheus's `instance` names it when it scrapes vLLM. The shipped Alertmanager config groups
# pages by it, so the sidecar's page and vLLM's own for the same engine arrive as one. A vLLM
# rule has the server's series, so it is their `instance`. The sidecar names the server by
# `--target`: beside vLLM that is a loopback URL, so the host is the sidecar's own (its
# `instance`, which shares the pod or host) and the port is the target's (or the scheme's).
_VLLM_INSTANCE = "{{ $labels.instance }}"
_LOOPBACK = r"^https?://(localhost|127\.[0-9.]+|\[::1\])(:[0-9]+)?(/.*)?$"
_URL = r"^https?://([^/]*?)(:[0-9]+)?(/.*)?$"  # host, :port, path
_TARGET_INSTANCE = (
    f"{{{{ $host := reReplaceAll `{_URL}` `$1` $labels.target }}}}"
    f"{{{{ $port := reReplaceAll `{_URL}` `$2` $labels.target }}}}"
    "{{ if not $port }}{{ $port = `:80` }}"
    "{{ if match `^https:` $labels.target }}{{ $port = `:443` }}{{ end }}{{ end }}"
    f"{{{{ if match `{_LOOPBACK}` $labels.target }}}}"
    "{{ $host = reReplaceAll `:[0-9]+$` `` $labels.instance }}{{ end }}"
    "{{ $host }}{{ $port }}"
)


def _alert(
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
    th: Thresholds,
    vllm_instance: str | None = None,
    *,
    keep_firing_for: str | None = None,
) -> dict[str, Any]:
    labels = {"severity": severity}
    if vllm_instance is not None:
        labels["vllm_instance"] = vllm_instance
    timing = {"for": for_} | ({"keep_firing_for": keep_firing_for} if keep_firing_for else {})
    return {
        "alert": name,
        "expr": expr,
        **timing,
        "labels": labels,
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{th.runbook_base_url}#{name.lower()}",
        },
    }


def _scaled(for_: str, scale: float) -> str:
    """`10m` scaled, in whole seconds (labs and tests use a small scale to see alerts fire)."""
    if scale == 1.0:
        return for_
    unit = {"s": 1, "m": 60, "h": 3600}[for_[-1]]
    return f"{max(1, round(float(for_[:-1]) * unit * scale))}s"


def rule_groups(
    th: Thresholds = DEFAULT_THRESHOLDS, sidecar_job: str = "kvwatch", for_scale: float = 1.0
) -> list[dict[str, Any]]:
    kv = f"max by ({_BY}) ({promql_selector(KV_USAGE)})"
    running = f"sum by ({_BY}) ({promql_selector(RUNNING)})"
    waiting = f"sum by ({_BY}) ({promql_selector(WAITING)})"
    preempt = f"sum by ({_BY}) (rate({promql_selector(PREEMPTIONS)}[1m]))"
    # from the raw series: a recorded series has one sample per rule evaluation (often 1m)
    waited = f"sum by ({_BY}) (max_over_time({promql_selector(WAITING)}[1m]))"
    finished = (
        f"sum by ({_BY}) (increase({promql_selector(REQUEST_PREEMPTIONS, suffix='count')}[5m]))"
    )
    le1 = promql_selector(REQUEST_PREEMPTIONS, 'le=~"1|1.0"', suffix="bucket")
    once = f"sum by ({_BY}) (increase({le1}[5m]))"
    where = "{{ $labels.instance }} ({{ $labels.model_name }}, engine {{ $labels.engine }})"
    recording = {
        "name": "kvwatch-vllm.rules",
        "rules": [
            {"record": "kvwatch:vllm_kv_cache_usage:max", "expr": kv},
            {"record": "kvwatch:vllm_requests_running:sum", "expr": running},
            {"record": "kvwatch:vllm_requests_waiting:sum", "expr": waiting},
            {"record": "kvwatch:vllm_preemptions:rate1m", "expr": preempt},
            {
                "record": "kvwatch:vllm_repeat_preempted_requests:increase5m",
                "expr": f"{finished} - {once}",
            },
        ],
    }
    pct = lambda x: f"{x * 100:g}%"  # noqa: E731
    vllm = {
        "name": "kvwatch-vllm.alerts",
        "rules": [
            _alert(
                "VllmKvCachePressure",
                f"kvwatch:vllm_kv_cache_usage:max > {th.pressure_kv:g}",
                "10m",
                "warning",
                f"vLLM KV cache above {pct(th.pressure_kv)} on {where}",
                "KV cache usage is {{ $value | humanizePercentage }}, above "
                f"{pct(th.pressure_kv)} for 10 minutes: little room for new prompts.",
                th,
                _VLLM_INSTANCE,
            ),
            _alert(
                "VllmKvCacheSaturated",
                # as the sidecar judges it: the cache ran out (sampled full, or vLLM preempted,
                # which it does only when a running request cannot get a block) while requests
                # waited. A spike fills the cache between scrapes, and the preemption counter
                # rises when the victim runs again, after the queue has drained: so waiting
                # counts over the same minute as the preemptions.
                f"(kvwatch:vllm_kv_cache_usage:max >= {th.saturated_kv:g} or on({_BY}) "
                f"kvwatch:vllm_preemptions:rate1m > 0) and on({_BY}) "
                f"{waited} >= {th.saturated_waiting:g}",
                "5m",
                "critical",
                f"vLLM KV cache full with requests waiting on {where}",
                "The KV cache ran out (usage at or above "
                f"{pct(th.saturated_kv)}, or requests preempted) while requests waited, "
                "minute after minute for 5 minutes.",
                th,
                _VLLM_INSTANCE,
            ),
            _alert(
                "VllmPreemptionRateHigh",
                f"kvwatch:vllm_preemptions:rate1m > {th.thrashing_preemptions_per_s:g}",
                "5m",
                "warning",
                f"vLLM preempting requests on {where}",
                "{{ $value | humanize }} preemptions per second, above "
                f"{th.thrashing_preemptions_per_s:g}/s for 5 minutes: requests are evicted "
                "from the KV cache and recomputed.",
                th,
                _VLLM_INSTANCE,
            ),
            _alert(
                "VllmRepeatedPreemptions",
                "kvwatch:vllm_repeat_preempted_requests:increase5m > 0",
                "5m",
                "warning",
                f"vLLM requests preempted again and again on {where}",
                "{{ $value | humanize }} requests finished in the last 5 minutes after being "
                "preempted twice or more: the same work is being redone.",
                th,
                _VLLM_INSTANCE,
            ),
            _alert(
                "VllmMetricsAbsent",
                f"absent({promql_selector(KV_USAGE)})",
                "10m",
                "warning",
                "No vLLM KV cache metrics at all",
                "No series of vllm:kv_cache_usage_perc (or its older and vllm_ spellings) for "
                "10 minutes: vLLM is down, not scraped, or runs with --disable-log-stats.",
                th,
            ),
        ],
    }
    side = {
        "name": "kvwatch-sidecar.alerts",
        "rules": [
            _alert(
                "KvwatchThrashing",
                'kvwatch_state{state="thrashing"} == 1',
                "1m",
                "critical",
                "vLLM thrashing on {{ $labels.target }} ({{ $labels.model_name }}, engine "
                "{{ $labels.engine }})",
                "The kvwatch sidecar judges this engine thrashing: a sustained stream of "
                f"preemptions (over {th.thrashing_preemptions_per_s:g}/s) on a full cache "
                "with work being redone. Size the cache: kvwatch advise.",
                th,
                _TARGET_INSTANCE,
                # one failed scrape of the sidecar (a restart, a timeout on a starved host)
                # makes its series stale: without this the page resolves, then fires again
                # after `for:` (the live test saw it resolved for 5 s mid-thrash)
                keep_firing_for="1m",
            ),
            _alert(
                "KvwatchTargetDown",
                "kvwatch_target_up == 0",
                "2m",
                "warning",
                "kvwatch cannot scrape {{ $labels.target }}",
                "The sidecar's scrapes of {{ $labels.target }} have failed for 2 minutes.",
                th,
                _TARGET_INSTANCE,
            ),
            _alert(
                "KvwatchVllmMetricsMissing",
                "kvwatch_vllm_metrics_present == 0",
                "5m",
                "warning",
                "{{ $labels.target }} exports no vLLM engine metrics",
                "The server answers /metrics without vllm engine series for 5 minutes "
                "(started with --disable-log-stats?).",
                th,
                _TARGET_INSTANCE,
            ),
            _alert(
                "KvwatchSidecarDown",
                f'up{{job="{sidecar_job}"}} == 0',
                "5m",
                "warning",
                "kvwatch sidecar {{ $labels.instance }} is down",
                "Prometheus cannot scrape the kvwatch sidecar for 5 minutes: thrashing would "
                "go unnoticed.",
                th,
            ),
        ],
    }
    for group in (vllm, side):
        for rule in group["rules"]:
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = _scaled(rule[key], for_scale)
    return [recording, vllm, side]


ALERT_NAMES = [r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
_HEADER = "# Generated by `kvwatch alerts` from sidecar/thresholds.py; do not edit by hand.\n"


def render_rules(th: Thresholds = DEFAULT_THRESHOLDS, for_scale: float = 1.0) -> str:
    body = yaml.dump(
        {"groups": rule_groups(th, for_scale=for_scale)},
        Dumper=_Dumper,
        sort_keys=False,
        width=10000,
    )
    return _HEADER + body


def render_prometheus_rule(th: Thresholds = DEFAULT_THRESHOLDS) -> str:
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kvwatch",
            "labels": {
                "app.kubernetes.io/name": "kvwatch",
                "prometheus": "k8s",
                "role": "alert-rules",
            },
        },
        "spec": {"groups": rule_groups(th)},
    }
    return _HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=10000)


def write_all(out_dir: Path, th: Thresholds = DEFAULT_THRESHOLDS) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {RULES_FILE: render_rules(th), K8S_FILE: render_prometheus_rule(th)}
    for name, text in files.items():
        (out_dir / name).write_text(text)
    return [out_dir / n for n in files]
