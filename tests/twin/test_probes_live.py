"""Probes and vLLM's own per-request timings on the twin (started with
`--enable-per-request-metrics`): the probes run beside the load on connections of their own and
are reported apart; the server's queue time and TTFT come back with every request and sit just
under the client's TTFT (docs/loadgen.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.twin.serve import TwinServer

pytestmark = pytest.mark.integration


def test_probes_beside_the_load_and_the_servers_own_timings(
    twin: TwinServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
         "--rate", "6", "--duration", "6", "--input-len", "300", "--output-len", "40",
         "--probe-rate", "2", "--probe-input-len", "48", "--probe-output-len", "8",
         "--seed", "11", "--run-dir", str(run), "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "bystander probes" in p.stdout and "outside the engine" in p.stdout
    records = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    probes = [r for r in records if r["probe"]]
    load = [r for r in records if not r["probe"]]
    summary = json.loads((run / "summary.json").read_text())
    # two a second for the stage's six seconds (and the last ones waited for, not cut)
    assert 11 <= len(probes) <= 14 and all(r["ok"] for r in probes)
    assert {r["prompt_tokens"] for r in probes} == {48} and {
        r["output_tokens"] for r in probes
    } == {8}
    assert summary["overall"]["requests"] == len(load)
    assert summary["probes"]["overall"]["completed"] == len(probes)
    # every request came back with vLLM's own timings, each under the client's own TTFT
    for r in records:
        assert r["server_ttft"] is not None and r["server_queue_time"] is not None, r
        assert r["server_queue_time"] + r["server_ttft"] <= r["ttft"], r
    t = summary["overall"]["server_timings"]
    assert t["requests"] == len(load)
    assert 0 <= t["client_overhead"]["p50"] < 0.1
