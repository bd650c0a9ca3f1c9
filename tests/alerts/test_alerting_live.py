"""Real Prometheus and Alertmanager scrape the real vLLM fixture and a sidecar: a thrashing load
makes the alerts fire and reach a webhook receiver, and resolve afterwards; the sidecar's own
webhook fires for the same load without them. `for:` durations are scaled down (0.02: one
minute becomes a second) so the test sees in seconds what production sees in minutes."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadgen.burst import run_burst
from loadgen.local_server import LocalVLLM
from tests.alertmanager import running_alertmanager
from tests.prometheus import prometheus_alerting
from tests.receiver import receiver
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration


def _am_events(got: list[dict]) -> list[tuple[str, str]]:
    return [(a["status"], a["labels"]["alertname"]) for g in got for a in g["body"]["alerts"]]


def test_thrashing_alerts_fire_and_resolve_both_ways(vllm_server: LocalVLLM) -> None:
    base = vllm_server.base_url
    with (
        receiver() as (am_hook, am_got),
        receiver() as (side_hook, side_got),
        running_sidecar(
            ["--target", base, "--interval", "0.5", "--db", "", "--webhook", side_hook]
        ) as side,
        running_alertmanager(am_hook) as am,
        prometheus_alerting(base, side, am),
    ):
        asyncio.run(run_burst(base, n=32, max_tokens=300, seed=41))
        # fired through Prometheus and Alertmanager
        vllm_rules = {"VllmPreemptionRateHigh", "VllmRepeatedPreemptions"}
        must = {"KvwatchThrashing", "VllmKvCacheSaturated"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            fired = {n for s, n in _am_events(am_got) if s == "firing"}
            if must <= fired and fired & vllm_rules:
                break
            time.sleep(0.5)
        assert must <= fired and fired & vllm_rules, _am_events(am_got)
        # and resolved once the load is gone
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            resolved = {n for s, n in _am_events(am_got) if s == "resolved"}
            if "KvwatchThrashing" in resolved:
                break
            time.sleep(1.0)
        assert "KvwatchThrashing" in resolved, _am_events(am_got)
    side_events = [(g["body"]["status"], g["body"]["alertname"]) for g in side_got]
    assert ("firing", "KvwatchThrashing") in side_events
    assert ("resolved", "KvwatchThrashing") in side_events
