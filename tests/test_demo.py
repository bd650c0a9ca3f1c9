"""A short demo run, end to end, against the session's real vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.local_server import LocalVLLM

pytestmark = pytest.mark.integration


def test_short_demo_against_running_server(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--target", vllm_server.base_url,
         "--light", "2", "--heavy", "24", "--max-tokens", "250", "--run-dir", str(run_dir)],
        capture_output=True, timeout=300,
    )  # fmt: skip
    out = p.stdout.decode()
    assert p.returncode == 0, out + p.stderr.decode()
    assert "heavy" in out and "requests: 26/26 completed" in out
    seen = int(out.split("preemptions seen by the sidecar: ")[1].split()[0])
    assert seen > 0
    assert "advice: undersized" in out and "--kv-cache-memory-bytes" in out
    state = json.loads((run_dir / "sidecar-state.json").read_text())
    assert state["targets"][0]["up"] is True
    assert len((run_dir / "requests.jsonl").read_text().splitlines()) == 26
