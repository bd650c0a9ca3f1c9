"""The generated Prometheus rules: checked in as generated, valid, and tested with promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kvwatch.alerts.build import (
    ALERT_NAMES,
    K8S_FILE,
    RULES_FILE,
    render_prometheus_rule,
    render_rules,
)
from kvwatch.sidecar.contract.thresholds import Thresholds

ALERTS = Path(__file__).resolve().parents[2] / "alerts"


class TestGenerated:
    def test_checked_in_files_match_the_code(self) -> None:
        regen = "run `kvwatch alerts --out alerts`"
        assert (ALERTS / RULES_FILE).read_text() == render_rules(), regen
        assert (ALERTS / K8S_FILE).read_text() == render_prometheus_rule(), regen

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
        am_file = ALERTS.parent / "deploy" / "alertmanager" / "alertmanager.yml"
        (critical,) = yaml.safe_load(am_file.read_text())["route"]["routes"]
        assert critical["group_by"] == ["vllm_instance", "model_name", "engine"]
        rules = [r for g in yaml.safe_load(render_rules())["groups"] for r in g["rules"]]
        paging = [r for r in rules if "alert" in r and r["labels"]["severity"] == "critical"]
        assert {r["alert"] for r in paging} == {
            "VllmKvCacheSaturated", "KvwatchThrashing", "KvwatchEngineDead",
        }  # fmt: skip
        for rule in paging:
            assert "vllm_instance" in rule["labels"], rule["alert"]

    def test_prometheus_rule_wraps_the_same_groups(self) -> None:
        k8s = yaml.safe_load(render_prometheus_rule())
        assert k8s["kind"] == "PrometheusRule"
        assert k8s["spec"]["groups"] == yaml.safe_load(render_rules())["groups"]
        assert len(ALERT_NAMES) == len(set(ALERT_NAMES)) == 14


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
