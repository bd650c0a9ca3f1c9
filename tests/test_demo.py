"""A short demo run, end to end, against the session's real vLLM; its report in real Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.local.server import LocalVLLM
from tests.browser import open_page

pytestmark = pytest.mark.integration

ARTIFACTS = Path("test-artifacts")


@pytest.fixture(scope="module")
def demo(vllm_server: LocalVLLM, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--target", vllm_server.base_url,
         "--light", "2", "--heavy", "24", "--max-tokens", "250", "--run-dir", str(run_dir)],
        capture_output=True, timeout=300,
    )  # fmt: skip
    out = p.stdout.decode()
    assert p.returncode == 0, out + p.stderr.decode()
    return out, run_dir


def test_short_demo_ramps_alerts_and_advises(demo: tuple[str, Path]) -> None:
    out, run_dir = demo
    # ramp: 2 streams (4 requests), 8 (8), 24 (24), each in the per-stage table
    for stage in ("concurrency:n=2#4", "concurrency:n=8#8", "concurrency:n=24#24"):
        assert any(line.startswith(stage + " ") for line in out.splitlines()), stage
    assert "requests: 36/36 completed" in out
    seen = int(out.split("preemptions seen by the sidecar: ")[1].split()[0])
    assert seen > 0
    assert ">>> webhook: firing Kvwatch" in out  # delivered to the local receiver and printed
    assert "advice: undersized" in out and "--kv-cache-memory-bytes" in out
    state = json.loads((run_dir / "sidecar-state.json").read_text())
    assert state["targets"][0]["up"] is True
    assert len((run_dir / "requests.jsonl").read_text().splitlines()) == 36
    alerts = [json.loads(x) for x in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert alerts and alerts[0]["status"] == "firing"
    timeline = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert len(timeline) >= 10 and {"ok"} < {r.get("state") for r in timeline}
    for name in ("dashboards/kvwatch-kv-pressure.json", "dashboards/kvwatch-fleet.json",
                 "alerts/kvwatch-rules.yaml", "alerts/kvwatch-prometheusrule.yaml",
                 "report.html"):  # fmt: skip
        assert (run_dir / name).stat().st_size > 0, name


def test_report_renders_offline_in_chromium(demo: tuple[str, Path]) -> None:
    _, run_dir = demo
    shot = ARTIFACTS / "report.png"
    check = open_page(run_dir / "report.html", shot)
    assert check.console_errors == [] and check.page_errors == []
    assert check.requests == [(run_dir / "report.html").resolve().as_uri()], check.requests
    assert len(check.svg_sizes) >= 6
    assert all(w > 300 and h > 100 for w, h in check.svg_sizes), check.svg_sizes
    assert all(n >= 3 for n in check.svg_marks), check.svg_marks  # something drawn in each
    # the stages' labels over the four charts over time: all drawn, none over another
    assert check.label_count == 4 * 3 and check.label_overlaps == [], check.label_overlaps
    assert check.labels_outside == []
    assert shot.stat().st_size > 20_000
