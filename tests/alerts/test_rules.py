"""The generated Prometheus rules: checked in as generated, valid, and tested with promtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kvwatch.alerts.autoscaling import KEDA_FILE, render_scaled_object
from kvwatch.alerts.build import (
    ALERT_NAMES,
    K8S_FILE,
    RULES_FILE,
    render_prometheus_rule,
    render_rules,
)
from kvwatch.alerts.routing import ALERTMANAGER_FILE, render_alertmanager
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import Thresholds

ALERTS = Path(__file__).resolve().parents[2] / "alerts"


class TestGenerated:
    def test_checked_in_files_match_the_code(self) -> None:
        regen = "run `kvwatch alerts --out alerts`"
        assert (ALERTS / RULES_FILE).read_text() == render_rules(), regen
        assert (ALERTS / K8S_FILE).read_text() == render_prometheus_rule(), regen
        assert (ALERTS / ALERTMANAGER_FILE).read_text() == render_alertmanager(), regen
        assert (ALERTS / KEDA_FILE).read_text() == render_scaled_object(), regen

    def test_every_alert_has_severity_for_and_runbook_section(self) -> None:
        runbook = (ALERTS / "runbook.md").read_text()
        doc = yaml.safe_load(render_rules())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                assert rule["labels"]["severity"] in ("critical", "warning", "info")
                assert rule["for"] and rule["annotations"]["summary"]
                assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())
                assert f"## {rule['alert']}\n" in runbook

    def test_thresholds_flow_into_expressions_and_text(self) -> None:
        text = render_rules(Thresholds(pressure_kv=0.8, pressure_exit_kv=0.7))
        assert "kvwatch:vllm_kv_cache_usage:max > 0.8" in text and "above 80%" in text

    def test_no_rule_queries_the_counter_without_total(self) -> None:
        text = render_rules()
        assert "num_preemptions_total" in text
        assert "num_preemptions}" not in text and 'num_preemptions"' not in text

    def test_alertmanager_groups_pages_by_labels_the_alerts_carry(self) -> None:
        """The shipped Alertmanager config groups pages by `vllm_instance`: every alert it
        routes as critical must carry it, or the sidecar's page and vLLM's split again."""
        routes = yaml.safe_load((ALERTS / ALERTMANAGER_FILE).read_text())["route"]["routes"]
        fleet_page, fleet, engine_page = routes
        assert engine_page["group_by"] == ["vllm_instance", "model_name", "engine"]
        assert fleet_page["group_by"] == fleet["group_by"] == ["alertname", "model_name"]
        rules = [r for g in yaml.safe_load(render_rules())["groups"] for r in g["rules"]]
        paging = [r for r in rules if "alert" in r and r["labels"]["severity"] == "critical"]
        assert {r["alert"] for r in paging} == {
            "VllmKvCacheSaturated", "KvwatchThrashing", "KvwatchEngineDead",
            "KvwatchFleetKvShortage",
        }  # fmt: skip
        for rule in paging:
            spec = cat.alert(rule["alert"])
            # an engine's page carries the engine's labels; a fleet's names only its model
            if spec.scope == "engine":
                assert "vllm_instance" in rule["labels"], rule["alert"]
                assert re.search(engine_page["matchers"][0].split("~")[1].strip('"'), spec.name)
            else:
                assert "vllm_instance" not in rule["labels"], rule["alert"]
                assert spec.name in fleet_page["matchers"][0]

    def test_every_alert_held_back_is_one_the_rules_raise(self) -> None:
        """An inhibit rule naming an alert nobody raises would silently hold back nothing."""
        ruled = {a.name for a in cat.ALERTS if cat.Route.RULES in a.routes}
        for spec in cat.ALERTS:
            assert set(spec.holds_back) <= ruled, spec.name

    def test_prometheus_rule_wraps_the_same_groups(self) -> None:
        k8s = yaml.safe_load(render_prometheus_rule())
        assert k8s["kind"] == "PrometheusRule"
        assert k8s["spec"]["groups"] == yaml.safe_load(render_rules())["groups"]
        assert len(ALERT_NAMES) == len(set(ALERT_NAMES)) == 17


class TestPromtool:
    def test_check_rules(self) -> None:
        p = subprocess.run(
            ["promtool", "check", "rules", str(ALERTS / RULES_FILE)], capture_output=True, text=True
        )
        assert p.returncode == 0, p.stdout + p.stderr

    @pytest.mark.parametrize("test_file", sorted(p.name for p in (ALERTS / "tests").glob("*.yaml")))
    def test_rule_tests(self, test_file: str) -> None:
        p = subprocess.run(
            ["promtool", "test", "rules", test_file],
            cwd=ALERTS / "tests",
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stdout + p.stderr
