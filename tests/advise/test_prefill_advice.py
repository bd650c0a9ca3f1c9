"""`kvwatch advise --run` names the prompt budget when a run's stalls were mostly prefill
interference (a run directory as the load generator writes it: tests/report/test_run_page.py's,
its stalls given causes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.report.test_run_page import _run_dir


def _advise(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--run", str(run), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _with_causes(tmp: Path, prefill_s: float, preempted_s: float) -> Path:
    run = _run_dir(tmp)
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary["overall"]["itl"] = {"p50": 0.02}
    summary["overall"]["stall_causes"] = {
        "prefill": {"stalls": 6, "seconds": prefill_s},
        "preempted": {"stalls": 2, "seconds": preempted_s},
    }
    path.write_text(json.dumps(summary))
    return run


def test_the_prompt_budget_is_named_when_prefill_is_most_of_the_stall_time(tmp_path: Path) -> None:
    run = _with_causes(tmp_path, 6.0, 1.0)
    p = _advise(run, "--gpu", "h100")  # vLLM's budget for an H100: 8,192 tokens
    assert "prefill interference: 6 stalls, 6.0 s (86% of the run's stall time)" in p.stdout
    assert "(now 8192)" in p.stdout and "(the run)" in p.stdout, p.stdout
    as_json = _advise(run, "--gpu", "h100", "--max-num-batched-tokens", "4096", "--json")
    (item,) = json.loads(as_json.stdout)
    assert item["prefill"]["budget_now"] == 4096 and item["prefill"]["budget_advised"] < 4096
    # with --model the step model sizes it (tests/timing/test_prefill_levers.py)


def test_nothing_is_said_of_it_when_the_cache_caused_the_stalls(tmp_path: Path) -> None:
    run = _with_causes(tmp_path, 1.0, 6.0)
    p = _advise(run, "--gpu", "h100")
    assert "prefill interference" not in p.stdout and p.returncode in (0, 1), p.stderr
