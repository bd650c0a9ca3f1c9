"""The fleet rules at a fleet's size: promtool runs the generated unit tests (fleet_scale.py) for
100 replicas of one model. At 1,000 the same tests are the bench's (bench_fleet_rules_cost.py
--promtool), with their time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from kvwatch.alerts.build import RULES_FILE
from tests.alerts.fleet_scale import scale_tests

ALERTS = Path(__file__).resolve().parents[2] / "alerts"


def test_fleet_judgements_single_out_one_of_100_replicas(tmp_path: Path) -> None:
    test_file = tmp_path / "fleet-scale-test.yaml"
    test_file.write_text(yaml.safe_dump(scale_tests(100, ALERTS / RULES_FILE), width=10000))
    p = subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert p.stdout.count("SUCCESS") == 1
