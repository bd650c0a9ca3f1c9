"""The calibration script runs (on the CPU, tiny batches: a smoke test, its figures mean
nothing) and writes the constants it fits with the date and device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration  # builds a layer of Mistral 7B in torch: a few seconds
def test_calibration_writes_its_fit(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    p = subprocess.run(
        [sys.executable, "bench/calibrate_twin.py", "--model", "mistral-7b", "--device", "cpu",
         "--quick",
         "--seconds", "0.05", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["date"][:2] == "20"
    assert set(doc["fitted"]) == {"hbm_efficiency", "mfu"}
    assert [r["kind"] for r in doc["rows"]] == ["decode", "decode", "prefill"]
    assert all(r["step_s"] > 0 and r["model_s"] > 0 for r in doc["rows"])
