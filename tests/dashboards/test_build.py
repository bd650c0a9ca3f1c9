"""The generated dashboards: checked in as generated, valid for Grafana's own 11.6 types, and
built from the vocabulary (both spellings, $__rate_interval, a unit and description each)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.dashboards.build import DASHBOARDS, build, render
from kvwatch.sidecar.contract.thresholds import Thresholds
from tests.dashboards.live import (
    annotation_queries,
    grafana_regex_escape,
    panel_queries,
    substitute,
)
from tests.dashboards.schema_check import check_dashboards

DIR = Path(__file__).resolve().parents[2] / "dashboards"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_checked_in_json_is_what_the_code_renders(name: str) -> None:
    regen = f"run `kvwatch dashboards --out dashboards` ({name} is stale)"
    assert (DIR / name).read_text() == render(name), regen


def test_grafana_types_accept_every_dashboard() -> None:
    assert check_dashboards([DIR / n for n in sorted(DASHBOARDS)]) == ""


def test_grafana_types_reject_a_broken_dashboard(tmp_path: Path) -> None:
    doc = build("kvwatch-kv-pressure.json")
    panel = next(p for p in doc["panels"] if p["type"] == "timeseries")
    panel["options"]["legend"]["displayMode"] = "tabel"  # not a LegendDisplayMode
    doc["templating"]["list"][1]["refresh"] = "sometimes"  # not a VariableRefresh
    doc["annotations"]["list"][0]["target"].pop("expr")  # a Prometheus query needs expr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    report = check_dashboards([bad])
    assert '"tabel"' in report and "VariableRefresh" in report, report
    assert "Property 'expr' is missing" in report, report


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_are_complete_and_use_the_vocabulary(name: str) -> None:
    doc = build(name)
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["description"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
    exprs = [q.expr for q in panel_queries(doc)] + list(annotation_queries(doc).values())
    for e in exprs:
        # every vLLM selector matches both spellings; no bare vllm: names
        assert not re.search(r"vllm:[a-z]", e.replace("vllm[:_]", "")), e
        assert "[1m]" not in e and "[5m]" not in e, f"fixed window in {e}"
        for window in re.findall(r"\}\[([^\]]*)\]\)", e):  # each range selector
            assert window in ("$__rate_interval", "$__range"), e
    names = {v["name"] for v in doc["templating"]["list"]}
    assert "datasource" in names and "model_name" in names
    for e in exprs:  # no variable the dashboard does not define
        used = set(re.findall(r"\$(\w+)", e)) - {"__rate_interval", "__range"}
        assert used <= names, (used - names, e)


def test_threshold_lines_follow_the_thresholds() -> None:
    doc = build("kvwatch-kv-pressure.json")
    kv = next(p for p in doc["panels"] if p["title"] == "KV cache usage")
    steps = [s["value"] for s in kv["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 0.9, 0.95]
    from kvwatch.dashboards.build import kv_pressure

    moved = kv_pressure(Thresholds(pressure_kv=0.8)).build()
    assert "(80%)" in json.dumps(moved, default=lambda o: o.to_json())


def test_substitute_like_grafana() -> None:
    e = 'rate(x{model_name=~"$model_name", m=~"$model"}[$__rate_interval]) [$__range]'
    got = substitute(e, {"model": "a", "model_name": "b"}, 300.4, "20s")
    assert got == 'rate(x{model_name=~"b", m=~"a"}[20s]) [300s]'


def test_cli_prints_and_writes(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "kvwatch", "dashboards"]
    p = subprocess.run([*run, "--print", "kvwatch-fleet.json"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == render("kvwatch-fleet.json")
    p = subprocess.run([*run, "--out", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0 and sorted(x.name for x in tmp_path.iterdir()) == sorted(DASHBOARDS)
    p = subprocess.run([*run, "--threshold", "pressure_kv=x"], capture_output=True, text=True)
    assert p.returncode == 2 and "pressure_kv" in p.stderr and "Traceback" not in p.stderr


def test_variable_values_are_escaped_like_grafana() -> None:
    # a model path in a PromQL regex: `.` escaped for the regex, the escape for the string
    assert grafana_regex_escape("/m/tiny.v1") == "/m/tiny\\\\.v1"
