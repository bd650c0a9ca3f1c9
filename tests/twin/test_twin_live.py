"""`kvwatch twin` end to end: vLLM's own server on the simulated H100, its figures labelled, the
seed's scenario as vLLM's scheduler plays it (the bench, bench/bench_twin_seed.py, records the
same run into docs/twin.md)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from kvwatch.advise.whatif import what_if
from kvwatch.cli import build_parser
from kvwatch.twin.serve import TwinServer
from tests.twin.conftest import TWIN_BLOCKS, TWIN_TIME_SCALE
from tests.twin.seed import run_seed, scrape

pytestmark = pytest.mark.integration


def test_it_starts_as_the_card_would_and_says_it_is_a_twin(twin: TwinServer) -> None:
    ns = build_parser().parse_args(
        ["advise", "--what-if", "--model", "llama-3.1-8b", "--gpu", "h100",
         "--max-model-len", "4096", "--kv-cache-memory-bytes", str(TWIN_BLOCKS * 16 * 131072)]
    )  # fmt: skip
    w = what_if(ns).to_dict()
    assert twin.capacity_line() == w["capacity_line"]
    text = httpx.get(twin.base_url + "/metrics", timeout=10).text
    info = re.search(r"vllm:cache_config_info\{([^}]*)\}", text)
    assert info and f'num_gpu_blocks="{TWIN_BLOCKS}"' in info[1] and 'block_size="16"' in info[1]
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
