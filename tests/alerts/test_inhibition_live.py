"""The shipped Alertmanager config, run by a real Alertmanager: while the sidecar reports a
server's preemptions as the priority policy at work (KvwatchPriorityPreemption), vLLM's own
saturation and preemption alerts for that engine, which cannot know the policy, are held back;
another server's are not. While a model's fleet is short of KV (KvwatchFleetKvShortage), every
replica's saturation and thrashing pages for that model are held back; another model's are not."""

from __future__ import annotations

import time

import httpx
import pytest

from kvwatch.fleet.alertmanager import running_alertmanager, shipped_config

pytestmark = pytest.mark.integration


def _alert(name: str, instance: str, severity: str, model: str = "m") -> dict[str, object]:
    return {"labels": {"alertname": name, "vllm_instance": instance, "model_name": model,
                       "engine": "0", "severity": severity}}  # fmt: skip


def _fleet_alert(name: str, model: str, severity: str) -> dict[str, object]:
    return {"labels": {"alertname": name, "model_name": model, "severity": severity}}


def _muted(sent: list[dict[str, object]]) -> dict[tuple[str, str], bool]:
    """Each alert sent, by name and server (or model), and whether Alertmanager holds it back."""
    with running_alertmanager(shipped_config("http://127.0.0.1:9/hook")) as am:
        httpx.post(f"{am}/api/v2/alerts", json=sent, timeout=10).raise_for_status()
        muted: dict[tuple[str, str], bool] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = httpx.get(f"{am}/api/v2/alerts", timeout=10).json()
            muted = {(a["labels"]["alertname"],
                      a["labels"].get("vllm_instance") or a["labels"]["model_name"]):
                     bool(a["status"]["inhibitedBy"]) for a in got}  # fmt: skip
            if len(muted) == len(sent):
                break
            time.sleep(0.2)
    return muted


def test_the_policy_at_work_holds_back_vllms_own_pages_for_that_engine() -> None:
    muted = _muted(
        [
            _alert("KvwatchPriorityPreemption", "a:8000", "warning"),
            _alert("VllmKvCacheSaturated", "a:8000", "critical"),
            _alert("VllmPreemptionRateHigh", "a:8000", "warning"),
            _alert("VllmKvCacheSaturated", "b:8000", "critical"),
        ]
    )
    assert muted == {
        ("KvwatchPriorityPreemption", "a:8000"): False,
        ("VllmKvCacheSaturated", "a:8000"): True,
        ("VllmPreemptionRateHigh", "a:8000"): True,
        ("VllmKvCacheSaturated", "b:8000"): False,
    }


def test_a_fleet_short_of_kv_pages_once_for_its_model() -> None:
    muted = _muted(
        [
            _fleet_alert("KvwatchFleetKvShortage", "m", "critical"),
            _alert("KvwatchThrashing", "a:8000", "critical"),
            _alert("VllmKvCacheSaturated", "a:8000", "critical"),
            _alert("KvwatchThrashing", "b:8000", "critical"),
            _alert("KvwatchEngineDead", "c:8000", "critical"),
            _alert("KvwatchThrashing", "x:8000", "critical", model="other"),
        ]
    )
    assert muted == {
        ("KvwatchFleetKvShortage", "m"): False,
        ("KvwatchThrashing", "a:8000"): True,
        ("VllmKvCacheSaturated", "a:8000"): True,
        ("KvwatchThrashing", "b:8000"): True,
        # a dead engine is not a shortage's consequence: it still pages
        ("KvwatchEngineDead", "c:8000"): False,
        ("KvwatchThrashing", "x:8000"): False,
    }
