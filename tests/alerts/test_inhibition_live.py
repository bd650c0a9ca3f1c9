"""The shipped Alertmanager config, run by a real Alertmanager: while the sidecar reports a
server's preemptions as the priority policy at work (KvwatchPriorityPreemption), vLLM's own
saturation and preemption alerts for that engine, which cannot know the policy, are held back;
another server's are not."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.alertmanager import running_alertmanager, shipped_config

pytestmark = pytest.mark.integration


def _alert(name: str, instance: str, severity: str) -> dict[str, object]:
    return {"labels": {"alertname": name, "vllm_instance": instance, "model_name": "m",
                       "engine": "0", "severity": severity}}  # fmt: skip


def test_the_policy_at_work_holds_back_vllms_own_pages_for_that_engine() -> None:
    with running_alertmanager(shipped_config("http://127.0.0.1:9/hook")) as am:
        sent = [
            _alert("KvwatchPriorityPreemption", "a:8000", "warning"),
            _alert("VllmKvCacheSaturated", "a:8000", "critical"),
            _alert("VllmPreemptionRateHigh", "a:8000", "warning"),
            _alert("VllmKvCacheSaturated", "b:8000", "critical"),
        ]
        httpx.post(f"{am}/api/v2/alerts", json=sent, timeout=10).raise_for_status()
        muted: dict[tuple[str, str], bool] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = httpx.get(f"{am}/api/v2/alerts", timeout=10).json()
            muted = {(a["labels"]["alertname"], a["labels"]["vllm_instance"]):
                     bool(a["status"]["inhibitedBy"]) for a in got}  # fmt: skip
            if len(muted) == len(sent):
                break
            time.sleep(0.2)
    assert muted == {
        ("KvwatchPriorityPreemption", "a:8000"): False,
        ("VllmKvCacheSaturated", "a:8000"): True,
        ("VllmPreemptionRateHigh", "a:8000"): True,
        ("VllmKvCacheSaturated", "b:8000"): False,
    }
