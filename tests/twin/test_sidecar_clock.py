"""The sidecar judges a time-scaled twin on the twin's simulated clock: the same simulated
run, served at K = 1 and at K = 4 (every interval four times longer on the wall clock), gives
the same rates, the same forecast and the same verdicts; and the scale is exported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.outputs.exporter import StateCollector
from kvwatch.sidecar.state.sidecar_state import SidecarState

ROOT = Path(__file__).resolve().parents[2]
BODY = (ROOT / "tests" / "data" / "vllm-0.33-metrics-offload-composed.txt").read_text()
GEN = re.compile(r"^(vllm:generation_tokens_total\{.*\} )(\S+)$", re.M)
USAGE = re.compile(r"^(vllm:kv_cache_usage_perc\{.*\} )(\S+)$", re.M)


def run(k: float | None, scrapes: int = 12) -> SidecarState:
    state = SidecarState(["http://twin"])
    for i in range(scrapes):
        body = GEN.sub(lambda m, i=i: f"{m[1]}{float(m[2]) + 500 * i}", BODY)
        body = USAGE.sub(lambda m, i=i: f"{m[1]}{0.40 + 0.04 * i}", body)
        # one simulated second between scrapes: K wall seconds
        now = 100.0 + i * (k or 1.0)
        state.record_scrape("http://twin", now, ScrapeOutcome(0.01, parse_exposition(body),
                                                              time_scale=k))  # fmt: skip
    return state


def engine(state: SidecarState, now: float) -> object:
    (target,) = state.view(now).targets
    (e,) = target.engines
    return e


def test_a_scaled_twin_reads_as_the_card_would() -> None:
    real, twin = run(None), run(4.0)
    a, b = engine(real, 111.0), engine(twin, 100.0 + 11 * 4.0)
    sa, sb = a.signals, b.signals  # type: ignore[attr-defined]
    assert sb.generation_tokens_per_s == pytest.approx(sa.generation_tokens_per_s)
    assert sa.generation_tokens_per_s == pytest.approx(500.0)
    assert sb.seconds_to_exhaustion == pytest.approx(sa.seconds_to_exhaustion)
    assert b.level == a.level  # type: ignore[attr-defined]


def test_the_scale_is_exported_and_shown() -> None:
    twin = run(4.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(lambda: twin.view(150.0)))
    text = generate_latest(reg).decode()
    assert 'kvwatch_target_time_scale{target="http://twin"} 4.0' in text
    (t,) = twin.view(150.0).targets
    assert t.time_scale == 4.0
    real = run(None)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(lambda: real.view(150.0)))
    assert 'kvwatch_target_time_scale{target="http://twin"} 1.0' in generate_latest(reg).decode()
