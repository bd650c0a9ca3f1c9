"""One catalogue alert as a Prometheus alerting rule: its labels, `for:`, and texts whose
labels and values are Prometheus template expressions (the sidecar fills the same texts with
what it saw, so the two paths say the same thing in the same words)."""

from __future__ import annotations

from typing import Any

from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import Thresholds

__all__ = ["alert_rule", "scaled", "VLLM_INSTANCE"]

# A vLLM rule has the server's own series: their `instance` is the server's host:port.
VLLM_INSTANCE = "{{ $labels.instance }}"


def _model_query(record: str, then: str) -> str:
    """A fleet recording's value for the alert's model, or `unknown` when it has none."""
    return (
        f"{{{{ with printf `{record}{{{cat.FLEET_BY}=%q}}` $labels.{cat.FLEET_BY} | query }}}}"
        f"{{{{ . | first | value | {then} }}}}{{{{ else }}}}unknown{{{{ end }}}}"
    )


def _engine_query(record: str, then: str) -> str:
    """A per-engine recording's value for the alert's engine, or `unknown`."""
    return (
        f"{{{{ with printf `{record}{{instance=%q,model_name=%q,engine=%q}}` $labels.instance "
        "$labels.model_name $labels.engine | query }}"
        f"{{{{ . | first | value | {then} }}}}{{{{ else }}}}unknown{{{{ end }}}}"
    )


_WHOLE = 'printf "%.0f"'
_PCT = "humanizePercentage"
_LOST, _F = cat.REC_FLEET_CAPACITY_LOST.name, cat.FLEET_BY
_LOST_SHARE = (
    f"{{{{ with printf `{_LOST}{{{_F}=%q}} / on({_F})"
    f" ({_LOST} + on({_F}) {cat.REC_FLEET_CAPACITY.name})` $labels.{_F} | query }}}}"
    f"{{{{ . | first | value | {_PCT} }}}}{{{{ else }}}}unknown{{{{ end }}}}"
)

# Each label and value an alert text may name, as the rule's template writes it.
_TEMPLATE_VALUES = {
    "where": "{{ $labels.instance }} ({{ $labels.model_name }}, engine {{ $labels.engine }})",
    "target": "{{ $labels.target }}",
    "model_name": "{{ $labels.model_name }}",
    "engine": "{{ $labels.engine }}",
    "instance": "{{ $labels.instance }}",
    "value": "{{ $value | humanize }}",
    "value_pct": "{{ $value | humanizePercentage }}",
    # the fleet's figures, read by the alert's template from the fleet recordings
    "replicas": _model_query(cat.REC_FLEET_REPLICAS.name, _WHOLE),
    "room": _model_query(cat.REC_FLEET_ROOM.name, _WHOLE),
    "replicas_needed": _model_query(cat.REC_FLEET_REPLICAS_NEEDED.name, _WHOLE),
    "kv_spread": _model_query(cat.REC_FLEET_KV_SPREAD.name, _PCT),
    "capacity_lost": _model_query(cat.REC_FLEET_CAPACITY_LOST.name, "humanize"),
    "capacity_lost_share": _LOST_SHARE,
    "fleet_routed": _model_query(cat.FLEET_PREFIX_REPLICAS_HIT_RATIO.name, _PCT),
    "fleet_pooled": _model_query(cat.FLEET_PREFIX_POOLED_HIT_RATIO.name, _PCT),
    "fleet_copies": _model_query(cat.FLEET_PREFIX_DUPLICATED_RATIO.name, _PCT),
    "request_share": _engine_query(cat.REC_REQUEST_SHARE.name, _PCT),
    "prompt_share": _engine_query(cat.REC_PROMPT_TOKEN_SHARE.name, _PCT),
}


def alert_rule(
    name: str, expr: str, th: Thresholds, vllm_instance: str | None, for_scale: float
) -> dict[str, Any]:
    """The catalogue's alert `name` as a Prometheus rule with this expression."""
    spec = cat.alert(name)
    labels: dict[str, str] = {"severity": spec.severity}
    if vllm_instance is not None:
        labels["vllm_instance"] = vllm_instance
    down_for = cat.human_duration(spec.for_seconds(th))
    summary, description = spec.texts(th, **_TEMPLATE_VALUES, down_for=down_for)
    rule: dict[str, Any] = {
        "alert": name,
        "expr": expr,
        "for": scaled(spec.for_duration(th), for_scale),
    }
    if spec.keep_firing_for:
        rule["keep_firing_for"] = scaled(spec.keep_firing_for, for_scale)
    return rule | {
        "labels": labels,
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": spec.runbook_url(th),
        },
    }


def scaled(for_: str, scale: float) -> str:
    """`10m` scaled, in whole seconds (labs and tests use a small scale to see alerts fire)."""
    if scale == 1.0:
        return for_
    return f"{max(1, round(cat.duration_seconds(for_) * scale))}s"
