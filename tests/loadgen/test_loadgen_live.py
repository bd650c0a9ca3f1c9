"""`kvwatch loadgen run` against the real vLLM fixture: every pattern, exact records, stalls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest

from kvwatch.local.server import LocalVLLM
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe
from tests.burst import THRASH_LOADGEN

pytestmark = pytest.mark.integration


def run(url: str, run_dir: Path, *args: str) -> list[dict]:
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", url, "--run-dir",
         str(run_dir), "--no-progress", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    with (run_dir / "requests.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


def check_records(records: list[dict], exact_input: bool = True) -> None:
    for r in records:
        assert r["ok"], r["error"]
        assert r["output_tokens"] == r["expected_output_tokens"]  # ignore_eos: usage says so
        if exact_input:
            assert r["prompt_tokens"] == r["expected_input_tokens"]
        # one chunk per token, except that vLLM merges a request's deltas when its API server
        # falls behind the engine (RequestOutputCollector): a chunk then carries two tokens
        assert 0 < r["chunks"] <= r["output_tokens"]
        assert 0 < r["ttft"] <= r["e2e"]
        assert r["dispatch_lag"] >= 0 and r["sent_at"] >= r["scheduled_at"]
        # the gaps cover the decode exactly: first token to last token
        assert sum(r["gaps"]) == pytest.approx(r["last_token_at"] - r["first_token_at"], abs=1e-6)
        assert r["last_token_at"] <= r["finished_at"]  # then usage and [DONE]


def test_every_pattern_in_one_multi_stage_run(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    stages = ["constant:rate=3@2s", "poisson:rate=3@2s", "gamma:rate=3,burstiness=0.5@2s",
              "ramp:start=1,end=5@2s", "concurrency:n=3#6"]  # fmt: skip
    args = [x for s in stages for x in ("--stage", s)]
    records = run(vllm_server.base_url, tmp_path, *args, "--input-len", "uniform:16,120",
                  "--output-len", "uniform:8,24", "--seed", "5")  # fmt: skip
    check_records(records)
    by_stage = {s: [r for r in records if r["stage"] == s] for s in stages}
    assert len(by_stage["constant:rate=3@2s"]) == 6
    assert len(by_stage["concurrency:n=3#6"]) == 6
    assert all(by_stage[s] for s in stages)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["stage"] for e in events if e["event"] == "stage_start"] == stages
    # the Parquet records are the same records
    df = pd.read_parquet(tmp_path / "requests.parquet")
    assert list(df["request_id"]) == [r["request_id"] for r in records]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["overall"]["completed"] == len(records)


def test_sweep_warmup_chat_in_two_processes(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    records = run(vllm_server.base_url, tmp_path, "--chat", "--sweep", "concurrency=1,2",
                  "--requests", "4", "--warmup", "1", "--input-len", "40",
                  "--output-len", "16", "--slo", "ttft=5s", "--workers", "2")  # fmt: skip
    check_records(records, exact_input=False)
    stages = [r["stage"] for r in records]
    assert "warmup" in stages and stages.count("concurrency=2") == 4
    assert stages.count("concurrency=1") == 4
    assert len({r["request_id"] for r in records}) == len(records)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["stages"]) == {"concurrency=1", "concurrency=2"}
    assert summary["overall"]["requests"] == 8 and summary["overall"]["goodput"] > 0


def _server_counts(base: str) -> tuple[float, float, float]:
    (obs,) = observe(parse_exposition(httpx.get(base + "/metrics").text)).values()
    assert obs.preemptions_total is not None and obs.finished_requests_total is not None
    return obs.preemptions_total, obs.finished_requests_total, obs.repeat_preempted_total or 0.0


def test_thrashing_run_shows_stalls_on_repeat_victims(vllm_server: LocalVLLM, tmp_path: Path
                                                      ) -> None:  # fmt: skip
    base = vllm_server.base_url
    p0, f0, r0 = _server_counts(base)
    records = run(base, tmp_path, "--concurrency", "32", "--requests", "32", *THRASH_LOADGEN,
                  "--seed", "9")  # fmt: skip
    p1, f1, r1 = _server_counts(base)
    check_records(records)
    assert f1 - f0 == 32
    preemptions, repeat_victims = p1 - p0, r1 - r0
    assert repeat_victims >= 5, "the load did not thrash; the fixture's KV cache changed?"
    stalls = sum(r["stalls"] for r in records)
    multi = sum(r["stalls"] >= 2 for r in records)
    # every preemption happens mid-decode, so the victim's stream shows a gap far above its norm
    assert stalls >= 0.5 * preemptions
    assert multi >= 0.6 * repeat_victims
    assert sum(r["stalls"] > 0 for r in records) >= repeat_victims
    # and they are read beside the server's counter: nearly all came while it preempted
    overall = json.loads((tmp_path / "summary.json").read_text())["overall"]
    assert overall["stalls"] == stalls
    assert overall["stalls_preempting"] >= 0.9 * stalls, (overall, preemptions)
    # the cache filled (the run's timeline samples the server once a second)
    timeline = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert max(row["kv_usage"] or 0 for row in timeline) >= 0.9, "the KV cache never filled"
    # one cause each: in a burst that only grows, the victims and the streams held behind
    # their recompute (no new prompt comes after the first wave)
    causes = [c for r in records for c in r["stall_causes"]]
    assert len(causes) == stalls
    assert sum(v["stalls"] for v in overall["stall_causes"].values()) == stalls
    kv = sum(c in ("preempted", "recompute") for c in causes)
    assert kv >= 0.8 * stalls, overall["stall_causes"]
