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
        assert len(ALERT_NAMES) == len(set(ALERT_NAMES)) == 18


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


def test_for_scale_reaches_every_file_written_and_bad_scales_are_refused(
    tmp_path: Path,
) -> None:
    """`alerts --out DIR --for-scale 0.01` wrote unscaled rules (only --print scaled them), and
    nan/inf gave a traceback."""
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvwatch", "alerts", *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    for scale, out in (("1", tmp_path / "one"), ("0.01", tmp_path / "lab")):
        assert run("--out", str(out), "--for-scale", scale).returncode == 0

    def fors(path: Path) -> list[str]:
        return re.findall(r"^\s+for: (\S+)", path.read_text(), flags=re.M)

    for name in (RULES_FILE, K8S_FILE):
        one, lab = fors(tmp_path / "one" / name), fors(tmp_path / "lab" / name)
        assert one and len(one) == len(lab) and one != lab, name
    for bad in ("nan", "inf", "0", "-1"):
        p = run("--print", "rules", "--for-scale", bad)
        assert p.returncode == 2 and "Traceback" not in p.stderr and "--for-scale" in p.stderr
