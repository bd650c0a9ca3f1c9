"""`kvwatch twin` end to end: vLLM's own server on the simulated H100, its figures labelled, the
seed's scenario as vLLM's scheduler plays it (the bench, bench/bench_twin_seed.py, records the
same run into docs/twin.md)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvwatch.advise.whatif import what_if
from kvwatch.cli import build_parser
from kvwatch.twin.serve import TwinServer
from tests.twin.conftest import TWIN_BLOCKS, TWIN_TIME_SCALE
from tests.twin.seed import cache_config, run_seed, scrape

pytestmark = pytest.mark.integration


def test_it_starts_as_the_card_would_and_says_it_is_a_twin(twin: TwinServer) -> None:
    ns = build_parser().parse_args(
        ["advise", "--what-if", "--model", "llama-3.1-8b", "--gpu", "h100",
         "--max-model-len", "4096", "--kv-cache-memory-bytes", str(TWIN_BLOCKS * 16 * 131072)]
    )  # fmt: skip
    w = what_if(ns).to_dict()
    assert twin.capacity_line() == w["capacity_line"]
    text = httpx.get(twin.base_url + "/metrics", timeout=10).text
    cc = cache_config(text)
    assert (cc["num_gpu_blocks"], cc["block_size"]) == (str(TWIN_BLOCKS), "16")
    m = scrape(text)
    assert m["kvwatch_twin_time_scale"] == TWIN_TIME_SCALE
    assert 'kvwatch_twin_info{gpu="h100",model="llama-3.1-8b",pp="1",tp="1"} 1.0' in text
    log = twin.server.log_path.read_text()
    assert "kvwatch twin: simulating NVIDIA H100 80GB HBM3 (kvwatch twin)" in log
    assert "kvwatch twin: built LlamaForCausalLM on the meta device (no weights)" in log


def test_the_seed_scenario(twin: TwinServer, twin_log: Path) -> None:
    r = asyncio.run(run_seed(twin.base_url, "llama-3.1-8b", twin_log, requests=100))
    # 100 requests each needing a new block every 16 tokens
    assert r.demand_per_step == pytest.approx(100 / 16, rel=0.10), r
    # the cache ran dry while nobody had finished
    assert r.first_preemption_s is not None and r.finished_at_first_preemption == 0, r
    assert r.first_finish_s is not None and r.first_preemption_s < r.first_finish_s
    # vLLM's FCFS policy took the newest admitted request first
    assert r.first_victim_admitted == r.newest_admitted_then, r
    # its recompute came back as one prefill: every token not still cached, in one step
    assert r.first_recompute_tokens is not None and r.first_recompute_of is not None
    assert r.first_recompute_tokens + (r.first_recompute_cached or 0) == r.first_recompute_of
    # the card kept time: the latencies are the card's, not this machine's
    assert r.behind_s < 0.1 * r.wall_s, r


def test_the_command_serves_says_what_it_is_and_stops_on_sigterm(tmp_path: Path) -> None:
    """`kvwatch twin` as a user runs it: the URL and vLLM's capacity line on stdout, a working
    server, and SIGTERM stops vLLM with it (nothing left behind, exit 0)."""
    import os
    import signal
    import subprocess
    import sys

    from kvwatch.local.server import group_alive

    with subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "twin", "--model", "llama-3.1-8b", "--gpu", "h200",
         "--log", str(tmp_path / "twin.log"), "--", "--max-model-len", "2048",
         "--kv-cache-memory-bytes", str(1000 * 16 * 131072)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            said: dict[str, str] = {}
            assert proc.stdout is not None
            for line in proc.stdout:
                key, _, value = line.rstrip("\n").partition("=")
                said[key] = value
                if key == "capacity":
                    break
            assert said["capacity"].startswith("GPU KV cache size: 16,000 tokens"), said
            assert said["twin"].startswith("llama-3.1-8b on h200 TP1 PP1 (simulated"), said
            assert httpx.get(said["base_url"] + "/health", timeout=10).status_code == 200
            vllm_pid = int(said["pid"])
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            assert not group_alive(vllm_pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _closed_loop(twin: TwinServer, streams: int, tmp: Path) -> dict[str, Any]:
    """One wave of `streams` streams of 1,400 + 100 tokens, as a user sends it."""
    run = tmp / f"c{streams}"
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
         "--concurrency", str(streams), "--requests", str(streams), "--input-len", "1400",
         "--output-len", "100", "--run-dir", str(run), "--no-progress", "--seed", str(streams)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    summary: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return summary


def test_the_what_ifs_onset_holds_on_the_twin(twin: TwinServer, tmp_path: Path) -> None:
    """The what-if says 85 streams of 1,400 + 100 tokens fit 8,000 blocks and 86 preempt
    (94 blocks each at the last step; one null block); vLLM's scheduler agrees, and the
    tokens/s it predicts at 85 are the twin's within 15% (bench/bench_whatif_load.py runs the
    full search on four models)."""
    ns = build_parser().parse_args(
        ["advise", "--what-if", "--model", "llama-3.1-8b", "--gpu", "h100",
         "--max-model-len", "4096", "--kv-cache-memory-bytes", str(TWIN_BLOCKS * 16 * 131072),
         "--concurrency", "85", "--prompt-len", "1400", "--output-len", "100"]
    )  # fmt: skip
    load = what_if(ns).load
    assert load is not None and load.at_concurrency is not None
    assert (load.fits_concurrency, load.kv_onset_concurrency) == (85, 86)
    clean = _closed_loop(twin, 85, tmp_path)
    assert clean["server"]["preemptions"] == 0, clean["server"]
    over = _closed_loop(twin, 86, tmp_path)
    assert over["server"]["preemptions"] >= 1, over["server"]
    # one wave: its prefill and 100 steps, against the steady state's 101-step cycle
    measured = clean["overall"]["output_token_throughput"] * clean["time_scale"]
    predicted = load.at_concurrency.output_tokens_per_s
    assert measured == pytest.approx(predicted, rel=0.15), (measured, predicted)
