"""promtool unit tests of the fleet rules at a fleet's size, generated for N replicas of one
model (the checked-in alerts/tests/fleet-rules-test.yaml has 2-4): the three judgements must
single out the right replica, or page once, with hundreds of healthy series beside them.
tests/alerts/test_fleet_scale.py runs it at 100 replicas; bench/bench_fleet_rules_cost.py
times it at 100 and 1,000."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.sidecar.contract import catalogue as cat

__all__ = ["scale_tests"]

_MODEL = "m"


def _vllm(i: int, name: str, values: str, extra: str = "") -> dict[str, str]:
    return {
        "series": f'{name}{{instance="r{i}:8000",model_name="{_MODEL}",engine="0"{extra}}}',
        "values": values,
    }


def _sidecar(i: int, name: str, values: str, model: bool = False) -> dict[str, str]:
    lab = f'instance="r{i}:9477",job="kvwatch",target="http://127.0.0.1:8000"'
    if model:
        lab += f',model_name="{_MODEL}",engine="0"'
    return {"series": f"{name}{{{lab}}}", "values": values}


def _replica(i: int, usage: str, preempt: str, prompt: str, down: bool = False) -> list[Any]:
    up = "1x3 0x9" if down else "1x12"
    return [
        _vllm(i, "vllm:kv_cache_usage_perc", usage),
        _vllm(i, "vllm:num_preemptions_total", preempt),
        _vllm(i, "vllm:num_requests_running", "40x12"),
        _vllm(i, "vllm:num_requests_waiting", "2x12"),
        _vllm(i, "vllm:request_success_total", "0+60x12", ',finished_reason="length"'),
        _vllm(i, "vllm:prompt_tokens_total", prompt),
        _vllm(i, "vllm:request_prompt_tokens_sum", "0+60000x12"),
        _vllm(i, "vllm:request_prompt_tokens_count", "0+60x12"),
        _vllm(i, "vllm:request_generation_tokens_sum", "0+30000x12"),
        _vllm(i, "vllm:request_generation_tokens_count", "0+60x12"),
        _sidecar(i, "kvwatch_target_up", up),
        _sidecar(i, "kvwatch_kv_cache_capacity_tokens", "100000x12", model=True),
    ]


def _firing(eval_time: str, alert: str, labels: str | None) -> dict[str, Any]:
    """The alert fires once with these labels, or (None) not at all. An alert_rule_test would
    need every annotation's text; ALERTS carries the labels."""
    want = [] if labels is None else [{"labels": f'{{alertname="{alert}",{labels}}}', "value": 1}]
    return {
        "expr": f'count by (alertname, instance, model_name) (ALERTS{{alertname="{alert}",'
        'alertstate="firing"})',
        "eval_time": eval_time,
        "exp_samples": want,
    }


def _recorded(rec: cat.Recording, value: float) -> dict[str, Any]:
    want = [{"labels": f'{rec.name}{{model_name="{_MODEL}"}}', "value": value}]
    return {"expr": rec.name, "eval_time": "6m", "exp_samples": want}


def _test(name: str, series: list[Any], checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "interval": "1m", "input_series": series, "promql_expr_test": checks}


def scale_tests(replicas: int, rules: Path) -> dict[str, Any]:
    """The promtool test file's document: imbalance, shortage and a replica down among N."""
    n = replicas
    piled = [
        s
        for i in range(n)
        for s in (
            _replica(i, "0.97x12", "0+60x12", "0+600000x12")
            if i == 0
            else _replica(i, "0.5x12", "0x12", "0+60000x12")
        )
    ]
    short = [s for i in range(n) for s in _replica(i, "0.97x12", "0+30x12", "0+60000x12")]
    down = [
        s
        for i in range(n)
        for s in _replica(i, "0.6x12" if i else "0.6x3 stale", "0x12", "0+60000x12", down=i == 0)
    ]
    m = f'model_name="{_MODEL}"'
    # demand: n x 42 requests x 1,500 tokens; an engine below 90%: 90,000 tokens
    needed = -(-n * 42 * 1500 // 90_000)
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            _test(
                f"{n} replicas, r0 full while the rest have room: imbalance on r0 alone",
                piled,
                [
                    _recorded(cat.REC_FLEET_ROOM, n - 1),
                    _firing("7m", "KvwatchFleetImbalance", f'instance="r0:8000",{m}'),
                    _firing("7m", "KvwatchFleetKvShortage", None),
                ],
            ),
            _test(
                f"{n} replicas all full: one shortage page, and the replicas needed",
                short,
                [
                    _recorded(cat.REC_FLEET_REPLICAS_NEEDED, needed),
                    _firing("7m", "KvwatchFleetKvShortage", m),
                    _firing("7m", "KvwatchFleetImbalance", None),
                ],
            ),
            _test(
                f"{n} replicas, r0 killed: one replica down, its capacity lost",
                down,
                [
                    _recorded(cat.REC_FLEET_CAPACITY_LOST, 100_000),
                    _firing("6m", "KvwatchFleetReplicaDown", m),
                    _firing("10m", "KvwatchFleetImbalance", None),
                ],
            ),
        ],
    }
