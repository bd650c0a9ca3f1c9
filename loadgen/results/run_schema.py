"""What each run file holds, field by field, and the one check every reader passes it through.

A run directory is read long after it was written, sometimes after a person edited it: a field
of the wrong type (text where a number was, a list where an object was) becomes absent (None),
an object or list of the wrong type becomes empty, and each change is counted, so `kvwatch
report` draws what it can and `kvwatch advise --run` says what is missing instead of crashing.
Fields the schema does not name pass through as they are (no reader relies on them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NUM", "BOUND", "TEXT", "FLAG", "STAMP", "SPEC", "SUMMARY", "RECORD", "EVENT", "TIMELINE_ROW",
    "Cleaned", "clean",
]  # fmt: skip

NUM = "number"  # a finite int or float (never a bool), below 1e15 in size
STAMP = "unix time"  # a number a clock can show (0 to year 5000)
BOUND = "number or infinity"  # a histogram bucket's upper bound
TEXT = "text"
FLAG = "true or false"
_MAX = 1e15
_MAX_STAMP = 95_617_584_000.0

_PCTS = {k: NUM for k in ("p50", "p90", "p95", "p99", "mean", "max", "min")}
_CACHE = {
    "block_size": NUM, "num_blocks": NUM, "kv_cache_memory_bytes": NUM,
    "gpu_memory_utilization": NUM, "kv_tokens": NUM, "sliding_window": NUM,
    "kv_offloading_gib": NUM, "cache_dtype": TEXT, "ssm_state_dtype": TEXT,
}  # fmt: skip
_SERVER_SNAPSHOT = {"cache": _CACHE, "version": TEXT, "preemption_buckets": [[BOUND]]}
SPEC: dict[str, Any] = {
    "target": TEXT, "model": TEXT, "start_unix": STAMP, "workload": {},
    "stages": [{"name": TEXT, "pattern": TEXT, "label": TEXT, "duration_s": NUM, "count": NUM,
                "warmup": FLAG}],
    "server_before": _SERVER_SNAPSHOT, "server_after": _SERVER_SNAPSHOT,
    "endpoint": TEXT, "ignore_eos": FLAG, "seed": NUM, "time_scale": NUM,
}  # fmt: skip
_OVERALL = {
    "completed": NUM, "failed": NUM, "duration_s": NUM, "output_token_throughput": NUM,
    "ttft": _PCTS, "itl": _PCTS, "e2e": _PCTS, "tpot": _PCTS, "dispatch_lag": _PCTS,
    "stalls": NUM, "requests_with_stalls": NUM, "stalls_preempting": NUM, "requests": NUM,
    "stall_causes": {"*": {"stalls": NUM, "seconds": NUM}},
    "server_timings": {k: _PCTS for k in ("queue_time", "ttft_after_queue", "client_overhead")},
}  # fmt: skip
_SERVER_DELTA = {
    k: NUM
    for k in ("preemptions", "repeat_preempted", "admission_rejections",
              "offload_allocation_failures", "prompt_tokens_cached", "prompt_tokens_computed",
              "prompt_tokens", "finished_requests")
}  # fmt: skip
_INCIDENT = {"what": TEXT, "at": TEXT, "detail": TEXT, "cause": TEXT, "lines": NUM}
_TURN = {"requests": NUM, "prompt_tokens_mean": NUM, "ttft": _PCTS}
SUMMARY: dict[str, Any] = {
    "overall": _OVERALL,
    "stages": {"*": _OVERALL},
    "classes": {"*": _OVERALL},
    "probes": {"overall": _OVERALL, "stages": {"*": _OVERALL}},
    "sessions": {"sessions": NUM, "cut": NUM, "turns": {"*": _TURN}, "working_set": {}},
    "trace": {},
    "time_scale": NUM,
    "server": _SERVER_DELTA,
    "sidecar": {"engines": {"*": {"status": TEXT, "reason": TEXT}}, "incidents": [_INCIDENT]},
}
RECORD: dict[str, Any] = {
    "ok": FLAG, "sent_at": NUM, "finished_at": NUM, "ttft": NUM, "e2e": NUM, "max_gap": NUM,
    "stalls": NUM, "prompt_tokens": NUM, "output_tokens": NUM, "expected_input_tokens": NUM,
    "expected_output_tokens": NUM, "tpot": NUM, "stage": TEXT, "probe": FLAG, "warmup": FLAG,
}  # fmt: skip
EVENT: dict[str, Any] = {"event": TEXT, "stage": TEXT, "t": NUM}
TIMELINE_ROW: dict[str, Any] = {
    "t": STAMP, "kv_usage": NUM, "running": NUM, "waiting": NUM, "preemptions_total": NUM,
    "state": TEXT,
}  # fmt: skip


@dataclass
class Cleaned:
    """How many values a reader dropped for having the wrong type (a counted skip)."""

    dropped: int = 0


def _fits(value: Any, kind: str) -> bool:
    if kind == TEXT:
        return isinstance(value, str)
    if kind == FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind == BOUND and value == math.inf:
        return True
    if not math.isfinite(value) or abs(value) > _MAX:
        return False
    return kind != STAMP or 0 <= value <= _MAX_STAMP


def clean(value: Any, schema: Any, count: Cleaned) -> Any:
    """`value` shaped as `schema` says: a dict schema keeps an object's known fields of the
    right type (a field `"*"` stands for every key); a one-item list schema keeps a list's
    items, each cleaned; a kind (NUM, TEXT...) keeps a value of that kind. What does not fit
    becomes None (a field), {} or [] (a container), and is counted."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            count.dropped += value is not None
            return {}
        out = {}
        for k, v in value.items():
            sub = schema.get(k, schema.get("*")) if isinstance(k, str) else None
            out[k] = v if sub is None else clean(v, sub, count)
        return out
    if isinstance(schema, list):
        if not isinstance(value, list):
            count.dropped += value is not None
            return []
        return [clean(v, schema[0], count) for v in value]
    if value is None or _fits(value, schema):
        return value
    count.dropped += 1
    return None
