"""The catalogue of what kvwatch emits is the one truth: every rule, panel, runbook section and
exported family names only what it holds, and the two alert paths agree where they meet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.alerts.build import render_prometheus_rule, render_rules, rule_groups
from kvwatch.alerts.runbook import read_runbook, sections
from kvwatch.dashboards.files import DASHBOARD_FILES
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS, Thresholds
from kvwatch.sidecar.logs.follow import FollowStats
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.outputs.alerting import active_alerts
from kvwatch.sidecar.outputs.exporter import StateCollector
from kvwatch.sidecar.state.sidecar_state import SidecarState

ROOT = Path(__file__).resolve().parents[3]
_NAME = re.compile(r"\bkvwatch(?:_[a-z_]+|:[a-z_]+:[a-z0-9_]+)")
_KNOWN = {m.series for m in cat.METRICS} | {m.name for m in cat.METRICS}
_KNOWN |= {r.name for r in cat.RECORDINGS}


def _alert_rules() -> list[dict[str, object]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def _unknown(text: str) -> set[str]:
    return {n for n in _NAME.findall(text) if n not in _KNOWN}


class TestNamesComeFromTheCatalogue:
    def test_every_rule_alert_is_catalogued_with_its_identity(self) -> None:
        for rule in _alert_rules():
            spec = cat.alert(str(rule["alert"]))  # KeyError: a rule the catalogue lacks
            assert cat.Route.RULES in spec.routes
            labels = rule["labels"]
            assert isinstance(labels, dict) and labels["severity"] == spec.severity
            assert rule["for"] == spec.for_duration(DEFAULT_THRESHOLDS)
            assert rule.get("keep_firing_for") == spec.keep_firing_for
        ruled = {a.name for a in cat.ALERTS if cat.Route.RULES in a.routes}
        assert ruled == {r["alert"] for r in _alert_rules()}

    def test_rules_name_only_catalogued_series(self) -> None:
        for text in (render_rules(), render_prometheus_rule()):
            assert not _unknown(text)
        recorded = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
        assert recorded == {r.name for r in cat.RECORDINGS}

    @pytest.mark.parametrize("name", DASHBOARD_FILES)
    def test_dashboards_name_only_catalogued_series(self, name: str) -> None:
        text = (ROOT / "dashboards" / name).read_text()
        assert _NAME.findall(text), "the dashboard queries the sidecar's series"
        assert not _unknown(text)

    def test_runbook_has_a_section_for_every_alert_and_no_other(self) -> None:
        have = set(sections(read_runbook()))
        assert {a.runbook_section for a in cat.ALERTS} == have
        assert not _unknown(read_runbook())

    def test_a_name_the_catalogue_lacks_is_caught(self) -> None:
        assert _unknown("rate(kvwatch_preemption_total[1m])") == {"kvwatch_preemption_total"}


def _busy_state(tmp_path: Path) -> SidecarState:
    # the real 0.32 busy body with the offload families composed from 0.33's source, so that
    # every engine gauge has something to say; scraped once a second for eight seconds, every
    # counter on and KV usage rising (rates have points, the forecast a trend)
    body = (ROOT / "tests" / "data" / "vllm-0.33-metrics-offload-composed.txt").read_text()
    counters = re.compile(
        r"^(vllm:(generation_tokens|prompt_tokens|prompt_tokens_by_source|kv_offload_(load|store)_bytes"
        r"|kv_offload_allocation_failure|admission_rejections)_total\{.*\} )(\S+)$",
        re.M,
    )
    usage = re.compile(r"^(vllm:kv_cache_usage_perc\{.*\} )(\S+)$", re.M)
    state = SidecarState(["http://a"])
    for i in range(40):  # history enough for the prefix cache's reference (half a minute)
        scrape = counters.sub(lambda m, i=i: f"{m[1]}{float(m[4]) + 100 * i}", body)
        scrape = usage.sub(lambda m, i=i: f"{m[1]}{0.5 + 0.005 * i}", scrape)
        state.record_scrape("http://a", 1.0 + i, ScrapeOutcome(0.01, parse_exposition(scrape)))
    log = (ROOT / "tests" / "data" / "vllm-0.32-cpu-server.log").read_text().splitlines()
    state.record_log_lines(log)
    return state


class TestExporter:
    def test_exports_exactly_the_catalogue(self, tmp_path: Path) -> None:
        state = _busy_state(tmp_path)
        state.log_stats, state.log_source = FollowStats(), "file"
        reg = CollectorRegistry(auto_describe=False)
        reg.register(StateCollector(lambda: state.view(40.0)))
        text = generate_latest(reg).decode()
        helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        # the text format names a counter's family by its `_total` series
        assert set(helps) == {m.series for m in cat.METRICS}
        for m in cat.METRICS:
            assert helps[m.series] == m.help and types[m.series] == m.type.value
        for m, _ in cat.ENGINE_GAUGES:
            assert f"{m.name}{{" in text, f"{m.name} has no sample on a busy server"
        assert {lab for lab in re.findall(r'state="(\w+)"', text)} == set(cat.STATES)


class TestTheTwoPathsAgree:
    def test_target_down_waits_the_same_window(self) -> None:
        th = Thresholds(target_down_after_s=90)
        (rule,) = [r for r in _alert_rules() if r["alert"] == "KvwatchTargetDown"]
        default = DEFAULT_THRESHOLDS.target_down_after_s
        assert rule["for"] == "2m" == cat.prometheus_duration(default)
        spec = cat.alert("KvwatchTargetDown")
        assert spec.for_duration(th) == "90s"
        state = SidecarState(["http://a"], th, wall_clock=lambda: 1000.0)
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.5, None, "timeout", "timed out"))
        assert active_alerts(state.view(1.0), th, 1089.0).active == []
        (a,) = active_alerts(state.view(1.0), th, 1090.0).active
        assert a.name == "KvwatchTargetDown" and a.labels["severity"] == spec.severity
        summary, _ = spec.texts(th, target="http://a", down_for="90 s")
        assert a.annotations["summary"] == summary
        assert a.annotations["runbook_url"].endswith("#kvwatchtargetdown")

    def test_metrics_missing_waits_its_window(self) -> None:
        th = Thresholds(metrics_missing_after_s=60)
        clock = [1000.0]
        state = SidecarState(["http://a"], th, wall_clock=lambda: clock[0])
        empty = parse_exposition("# nothing from vLLM\nprocess_cpu_seconds_total 1\n")
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.01, empty))
        clock[0] = 1059.0
        state.record_scrape("http://a", 2.0, ScrapeOutcome(0.01, empty))
        assert active_alerts(state.view(2.0), th, clock[0]).active == []
        clock[0] = 1060.0
        state.record_scrape("http://a", 3.0, ScrapeOutcome(0.01, empty))
        (a,) = active_alerts(state.view(3.0), th, clock[0]).active
        assert a.name == "KvwatchVllmMetricsMissing"
        assert "for 1 minute" in a.annotations["description"]

    def test_rule_and_webhook_say_the_same_words(self) -> None:
        doc = yaml.safe_load(render_rules())
        (rule,) = [
            r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "KvwatchThrashing"
        ]
        spec = cat.alert("KvwatchThrashing")
        _, description = spec.texts(DEFAULT_THRESHOLDS, target="x", model_name="m", engine="0")
        assert rule["annotations"]["description"] == description
        assert json.dumps(rule["annotations"]).count("{{ $labels.target }}") == 1

    def test_every_state_above_ok_has_a_webhook_alert(self) -> None:
        from kvwatch.sidecar.contract.levels import Level

        for level in Level:
            spec = cat.alert_for_level(level)
            assert (spec is None) == (level is Level.OK)
            if spec is not None:
                assert cat.Route.WEBHOOK in spec.routes
