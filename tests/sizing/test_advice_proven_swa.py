"""Advice on a REAL sliding-window server, proven by rerunning the load.

The model is the tiny Llama with a 64-token sliding window on every other layer
(`kvwatch/local/tiny_model.py`, `SWA_SPEC`): vLLM gives it two KV cache groups (4 full-attention
layers, 4 sliding-window layers), so a block is half the dense size and a 330-token request
holds 11 blocks in the full group and at most 3 in the sliding one. Sized as full attention (the
old arithmetic, or `advise` without `--model`), the same load needs a different memory, wrongly.

Checked here: vLLM's startup figures equal the what-if's; `advise --run --model` counts the
groups. The advised `--kv-cache-memory-bytes` applied to a restarted server and the same seeded
spikes rerun (at least 90% fewer preemptions at 85% of the throughput or more), with the
bisection for the smallest memory that works, is bench/bench_sizing_sliding.py (docs/sizing.md);
CI keeps one lever's rerun, the dense one (test_advice_proven.py), to hold the suite's budget.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvwatch.loadgen.results.rundir import run_outcome
from kvwatch.local.server import LocalVLLM, ServerConfig
from tests.advise.test_sources import advise
from tests.loadgen.test_loadgen_live import run as loadgen_run
from tests.sidecar.running import running_sidecar
from tests.sizing.test_advice_proven import LENGTHS

pytestmark = pytest.mark.integration

KV_BYTES = 10 * 2**20  # 80 blocks of 32 tokens x 4 layers x 4 KiB
SWA_WORKLOAD = ["--stage", "burst:size=8,every=12@48s", *LENGTHS]


def advise_json(*args: str) -> tuple[int, dict]:
    rc, (item,) = advise(*args)
    return rc, item


@pytest.fixture(scope="module")
def swa_model() -> Path:
    from kvwatch.local.tiny_model import SWA_SPEC, build_tiny_model

    return build_tiny_model(SWA_SPEC)


@pytest.fixture(scope="module")
def swa_server(swa_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVLLM]:
    log = tmp_path_factory.mktemp("swa-vllm") / "vllm.log"
    with LocalVLLM(ServerConfig(model=swa_model, nice=10), log_path=log) as srv:
        yield srv


@pytest.fixture(scope="module")
def before(
    swa_server: LocalVLLM, swa_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    run_dir = tmp_path_factory.mktemp("swa-before")
    loadgen_run(swa_server.base_url, run_dir, *SWA_WORKLOAD)
    rc, item = advise_json("--run", str(run_dir), "--model", str(swa_model))
    assert rc == 1, "undersized"
    out = run_outcome(run_dir)
    assert out["preemptions"] >= 10, "the workload did not thrash the sliding-window server"
    _, dense = advise_json("--run", str(run_dir))
    return {"advice": item["advice"], "dense": dense["advice"], "run_dir": run_dir, **out}


def test_vllm_starts_with_the_what_if_figures(swa_server: LocalVLLM, swa_model: Path) -> None:
    _, item = advise_json(
        "--what-if", "--model", str(swa_model), "--gpu", "cpu", "--kv-cache-memory-bytes",
        str(KV_BYTES), "--block-size", "32", "--max-model-len", "1024",
    )  # fmt: skip
    w = item["what_if"]
    body = httpx.get(swa_server.base_url + "/metrics", timeout=10).text
    (line,) = [x for x in body.splitlines() if x.startswith("vllm:cache_config_info{")]
    assert f'num_gpu_blocks="{w["num_gpu_blocks"]}"' in line
    assert f'kv_cache_size_tokens="{w["kv_cache_size_tokens"]}"' in line
    assert f'kv_cache_max_concurrency="{w["max_concurrency"]!r}"' in line
    assert w["capacity_line"] in swa_server.log_path.read_text()


def test_advice_counts_the_groups(before: dict) -> None:
    a, dense = before["advice"], before["dense"]
    # a 330-token request: 3 blocks in the 64-token window + 11 in the full group (layer 0
    # slides, so vLLM's first group is the sliding one)
    assert any("holds 3 (sliding 64) + 11 (full) blocks" in x for x in a["arithmetic"])
    assert a["blocks_needed"] > dense["blocks_needed"]  # full attention undercounts here
    assert any("several KV groups" in x for x in dense["assumptions"])


def test_the_sidecar_takes_the_model(
    swa_server: LocalVLLM, swa_model: Path, tiny_model: Path
) -> None:
    """The sidecar beside the sliding-window server: it learns the server's version, its model
    matches vLLM's own figures, and the dense tiny model (twice the bytes a block, so 40 blocks,
    not 80) does not, and says so."""
    for model, error in ((swa_model, None), (tiny_model, "vLLM made 80")):
        args = ["--target", swa_server.base_url, "--db", "", "--model", str(model)]
        with running_sidecar(args) as side:
            deadline = time.monotonic() + 20
            while True:
                state = httpx.get(side + "/api/state", timeout=5).json()
                engines = state["targets"][0]["engines"]
                if (engines and state["targets"][0]["vllm_version"]) or (
                    time.monotonic() > deadline
                ):
                    break
                time.sleep(0.3)
        (engine,) = engines
        assert state["targets"][0]["vllm_version"] == "0.32.0"  # from GET /version
        if error is None:
            assert engine["model_error"] is None
        else:
            assert error in engine["model_error"]
