"""Real Prometheus and Alertmanager scrape the real vLLM fixture and a sidecar: a thrashing load
makes the alerts fire and reach a webhook receiver, and resolve afterwards; the sidecar's own
webhook fires for the same load without them. `for:` durations are scaled down (0.02: one
minute becomes a second) so the test sees in seconds what production sees in minutes.
Alertmanager runs the shipped config (alerts/kvwatch-alertmanager.yml), its timers at 1 s: the
sidecar's page and vLLM's own for the same engine must arrive as one group."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from kvwatch.fleet.alertmanager import running_alertmanager, shipped_config
from kvwatch.local.server import LocalVLLM
from tests.burst import THRASH_N, THRASH_TOKENS, run_burst
from tests.prometheus import prometheus_alerting
from tests.receiver import receiver
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration


def _am_events(got: list[dict]) -> list[tuple[str, str]]:
    return [(a["status"], a["labels"]["alertname"]) for g in got for a in g["body"]["alerts"]]


def _group_keys(got: list[dict], name: str) -> set[tuple[str, str]]:
    """(receiver, group key) of each notification that carried `name` firing."""
    return {
        (g["body"]["receiver"], g["body"]["groupKey"])
        for g in got
        for a in g["body"]["alerts"]
        if a["labels"]["alertname"] == name and a["status"] == "firing"
    }


def _side_events(got: list[dict]) -> list[tuple[str, str]]:
    return [(g["body"]["status"], g["body"]["alertname"]) for g in got]


def _last_status(events: list[tuple[str, str]], name: str) -> str | None:
    return next((s for s, n in reversed(events) if n == name), None)


def _timeline(t0: float, am_got: list[dict], side_got: list[dict]) -> str:
    """Both receivers' events in arrival order, seconds after the burst ended."""
    rows = [
        (g["t"] - t0, "alertmanager", a["status"], a["labels"]["alertname"])
        for g in am_got
        for a in g["body"]["alerts"]
    ] + [(g["t"] - t0, "sidecar", g["body"]["status"], g["body"]["alertname"]) for g in side_got]
    return "\n".join(f"{t:+7.1f} s {who:12} {s:8} {n}" for t, who, s, n in sorted(rows))


def _scrapes(prom: str) -> str:
    """How Prometheus's scrapes of the sidecar went: a failed one resolves its alerts."""
    out = []
    for expr in (
        'min_over_time(up{job="kvwatch"}[10m])',
        'max_over_time(scrape_duration_seconds{job="kvwatch"}[10m])',
    ):
        r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=5).json()
        out.append(f"{expr} = {[x['value'][1] for x in r['data']['result']]}")
    return "\n" + "\n".join(out)


def test_thrashing_alerts_fire_and_resolve_both_ways(vllm_server: LocalVLLM) -> None:
    base = vllm_server.base_url
    with (
        receiver() as (am_hook, am_got),
        receiver() as (side_hook, side_got),
        running_sidecar(
            ["--target", base, "--interval", "0.5", "--db", "", "--webhook", side_hook]
        ) as side,
        running_alertmanager(shipped_config(am_hook)) as am,
        prometheus_alerting(base, side, am) as prom,
    ):
        asyncio.run(run_burst(base, n=THRASH_N, max_tokens=THRASH_TOKENS, seed=41))
        burst_end = time.time()
        # fired through Prometheus and Alertmanager
        vllm_warnings = {"VllmPreemptionRateHigh", "VllmRepeatedPreemptions"}
        must = {"KvwatchThrashing", "VllmKvCacheSaturated"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            fired = {n for s, n in _am_events(am_got) if s == "firing"}
            if must <= fired and fired & vllm_warnings:
                break
            time.sleep(0.5)
        seen = _timeline(burst_end, am_got, side_got) + _scrapes(prom)
        assert must <= fired and fired & vllm_warnings, seen
        # one page: the sidecar's thrashing and vLLM's saturation share the on-call group
        keys = _group_keys(am_got, "KvwatchThrashing")
        assert len(keys) == 1 and keys == _group_keys(am_got, "VllmKvCacheSaturated"), seen
        assert next(iter(keys))[0] == "inference-oncall", seen
        # and resolved once the load is gone, on both paths. The last word counts: scrapes of
        # the sidecar that fail on this busy machine (1 s interval) can leave its series stale
        # for longer than keep_firing_for (scaled to 1.2 s here), which resolves the Prometheus
        # alert for a moment while the sidecar still judges thrashing.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            both = (
                _last_status(_am_events(am_got), "KvwatchThrashing"),
                _last_status(_side_events(side_got), "KvwatchThrashing"),
            )
            if both == ("resolved", "resolved"):
                break
            time.sleep(1.0)
        seen = _timeline(burst_end, am_got, side_got) + _scrapes(prom)
        assert both == ("resolved", "resolved"), seen
    assert ("firing", "KvwatchThrashing") in _side_events(side_got)
