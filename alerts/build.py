"""Prometheus recording and alerting rules, rendered from the vocabulary and the thresholds.

Every selector matches both the `vllm:` and the `vllm_` spelling; the preemption rule uses the
`_total` counter that vLLM really exposes (rules that query `vllm:num_preemptions` never fire).
Thresholds come from sidecar/contract/thresholds.py, the same the sidecar judges by, and are written
into the annotations too, so "above 90%" cannot drift from `> 0.9`. `kvwatch alerts` writes the
files; a test fails if the checked-in files differ from what this renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvwatch.alerts.autoscaling import KEDA_FILE, render_scaled_object
from kvwatch.alerts.fleet import fleet_groups
from kvwatch.alerts.routing import ALERTMANAGER_FILE, render_alertmanager
from kvwatch.alerts.rule import VLLM_INSTANCE, alert_rule
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS, Thresholds
from kvwatch.sidecar.contract.vocabulary import (
    ADMISSION_REJECTIONS,
    KV_OFFLOAD_ALLOCATION_FAILURES,
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
    ran_out = (
        f"({cat.REC_KV_USAGE.name} >= {th.saturated_kv:g} or on({_BY}) "
        f"{cat.REC_PREEMPTION_RATE.name} > 0)"
    )
    refused = (
        f"sum by (instance, model_name) (increase({promql_selector(ADMISSION_REJECTIONS)}[1m]))"
    )
    offload_full = (
        f"sum by ({_BY}) (increase({promql_selector(KV_OFFLOAD_ALLOCATION_FAILURES)}[5m])) > 0"
    )
    le1 = promql_selector(REQUEST_PREEMPTIONS, 'le=~"1|1.0"', suffix="bucket")
    once = f"sum by ({_BY}) (increase({le1}[5m]))"
    recording = {
        "name": "kvwatch-vllm.rules",
        "rules": [
            {"record": cat.REC_KV_USAGE.name, "expr": kv},
            {"record": cat.REC_RUNNING.name, "expr": running},
            {"record": cat.REC_WAITING.name, "expr": waiting},
            {"record": cat.REC_PREEMPTION_RATE.name, "expr": preempt},
            {"record": cat.REC_REPEAT_PREEMPTED.name, "expr": f"{finished} - {once}"},
        ],
    }
    st = {
        "pressure": f"{cat.REC_KV_USAGE.name} > {th.pressure_kv:g}",
        # as the sidecar judges it: the cache ran out (sampled full, or vLLM preempted,
        # which it does only when a running request cannot get a block) while requests
        # waited. A spike fills the cache between scrapes, and vLLM counts a preemption
        # with the victim's next output: under async scheduling (the default on a GPU)
        # that is the token it had in flight, in the second it was preempted; without it
        # (the CPU fixture) when the victim runs again, after the queue may have drained.
        # So waiting counts over the same minute as the preemptions.
        # Requests refused at --max-num-queued-reqs count as waiting; vLLM counts them per
        # model (no engine label), so they match on instance and model.
        "saturated": f"({ran_out} and on({_BY}) {waited} >= {th.saturated_waiting:g}) or "
        f"({ran_out} and on(instance, model_name) {refused} > 0)",
        "preempting": f"{cat.REC_PREEMPTION_RATE.name} > {th.thrashing_preemptions_per_s:g}",
    }
    a = alert_rule
    s = for_scale
    vllm = {
        "name": "kvwatch-vllm.alerts",
        "rules": [
            a("VllmKvCachePressure", st["pressure"], th, VLLM_INSTANCE, s),
            a("VllmKvCacheSaturated", st["saturated"], th, VLLM_INSTANCE, s),
            a("VllmPreemptionRateHigh", st["preempting"], th, VLLM_INSTANCE, s),
            a("VllmRepeatedPreemptions", f"{cat.REC_REPEAT_PREEMPTED.name} > 0", th,
              VLLM_INSTANCE, s),
            a("VllmKvOffloadTierFull", offload_full, th, VLLM_INSTANCE, s),
            a("VllmMetricsAbsent", f"absent({promql_selector(KV_USAGE)})", th, None, s),
        ],
    }  # fmt: skip
    side = {
        "name": "kvwatch-sidecar.alerts",
        "rules": [
            a("KvwatchThrashing", cat.STATE.select('state="thrashing"') + " == 1", th,
              _TARGET_INSTANCE, s),
            # the sidecar's own condition (the forecast counting down inside the horizon, and
            # quiet once saturation or thrashing, their own pages, has taken over): the
            # countdown needs the forecast's history at the sidecar's grain, not Prometheus's
            a("KvwatchKvExhaustionImminent", f"{cat.KV_EXHAUSTION_IMMINENT.select()} == 1", th,
              _TARGET_INSTANCE, s),
            # the sidecar's own condition too: the reference hit share comes from its history
            a("KvwatchPrefixCacheThrashing", f"{cat.PREFIX_CACHE_THRASHING.select()} == 1", th,
              _TARGET_INSTANCE, s),
            # the sidecar's judgement of whose preemptions the policy made (judge/detect.py),
            # averaged: a priority workload's preemptions come in bursts
            a("KvwatchPriorityPreemption",
              f"avg_over_time({cat.POLICY_PREEMPTIONS_PER_SECOND.select()}[5m]) > 0", th,
              _TARGET_INSTANCE, s),
            a("KvwatchTargetDown", f"{cat.TARGET_UP.select()} == 0", th, _TARGET_INSTANCE, s),
            a("KvwatchEngineDead", f"{cat.ENGINE_ALIVE.select()} == 0", th, _TARGET_INSTANCE, s),
            a("KvwatchVllmMetricsMissing", f"{cat.VLLM_METRICS_PRESENT.select()} == 0", th,
              _TARGET_INSTANCE, s),
            a("KvwatchSidecarDown", f'up{{job="{sidecar_job}"}} == 0', th, None, s),
        ],
    }  # fmt: skip
    return [recording, vllm, side, *fleet_groups(th, sidecar_job, for_scale)]


ALERT_NAMES = [r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
_HEADER = (
    "# Generated by `kvwatch alerts` from sidecar/contract/thresholds.py; do not edit by hand.\n"
)


def render_rules(th: Thresholds = DEFAULT_THRESHOLDS, for_scale: float = 1.0) -> str:
    body = yaml.dump(
        {"groups": rule_groups(th, for_scale=for_scale)},
        Dumper=_Dumper,
        sort_keys=False,
        width=10000,
    )
    return _HEADER + body


def render_prometheus_rule(th: Thresholds = DEFAULT_THRESHOLDS, for_scale: float = 1.0) -> str:
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
        "spec": {"groups": rule_groups(th, for_scale=for_scale)},
    }
    return _HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=10000)


def write_all(
    out_dir: Path, th: Thresholds = DEFAULT_THRESHOLDS, for_scale: float = 1.0
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        RULES_FILE: render_rules(th, for_scale),
        K8S_FILE: render_prometheus_rule(th, for_scale),
        ALERTMANAGER_FILE: render_alertmanager(),
        KEDA_FILE: render_scaled_object(),
    }
    for name, text in files.items():
        (out_dir / name).write_text(text)
    return [out_dir / n for n in files]
