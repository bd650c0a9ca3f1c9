"""Advice proven by rerunning the load: take each advised setting, restart vLLM with it, rerun the
same seeded thrashing workload, and compare preemptions and completed-token throughput.

The workload is traffic spikes: 8 requests of 30 + 300 tokens at once every 12 s. Each spike
needs 88 blocks of the fixture's 40 and thrashes; between spikes the server has compute to spare.
That is where the admission levers belong (--max-num-active-seqs, --watermark): with them, a spike
queues instead of thrashing. Under sustained saturation they cost throughput instead
(bench/bench_sizing_levers.py, docs/sizing.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.loadgen.results.rundir import run_outcome
from kvwatch.local.server import LocalVLLM, ServerConfig
from tests.loadgen.test_loadgen_live import run as loadgen_run

pytestmark = pytest.mark.integration

LENGTHS = ["--input-len", "30", "--output-len", "300", "--seed", "9"]
WORKLOAD = ["--stage", "burst:size=8,every=12@72s", *LENGTHS]


@pytest.fixture(scope="module")
def before(vllm_server: LocalVLLM, tmp_path_factory: pytest.TempPathFactory) -> dict:
    run_dir = tmp_path_factory.mktemp("before")
    loadgen_run(vllm_server.base_url, run_dir, *WORKLOAD)
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--run", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stderr  # undersized
    (item,) = json.loads(p.stdout)
    out = run_outcome(run_dir)
    assert out["preemptions"] >= 20, "the workload did not thrash on the fixture"
    return {"advice": item["advice"], **out}


def rerun(
    model: Path, run_dir: Path, workload: list[str] = WORKLOAD, **cfg: object
) -> dict[str, float]:
    """Run `workload` on a fresh vLLM started with `cfg`; the server's log lands beside."""
    log = run_dir.with_name(run_dir.name + "-vllm.log")
    with LocalVLLM(ServerConfig(model=model, nice=10, **cfg), log_path=log) as srv:  # type: ignore[arg-type]
        loadgen_run(srv.base_url, run_dir, *workload)
    return run_outcome(run_dir)


def _check(lever: str, before: dict, after: dict[str, float]) -> None:
    print(
        f"{lever}: preemptions {before['preemptions']:.0f} -> {after['preemptions']:.0f}, "
        f"throughput {before['output_token_throughput']:.0f} -> "
        f"{after['output_token_throughput']:.0f} tok/s, e2e p99 {before['e2e_p99']:.2f} -> "
        f"{after['e2e_p99']:.2f} s, stalls {before['stalls']:.0f} -> {after['stalls']:.0f}"
    )
    assert after["preemptions"] <= 0.1 * before["preemptions"]
    assert after["output_token_throughput"] >= 0.85 * before["output_token_throughput"]


def test_more_kv_memory_as_advised(before: dict, tiny_model: Path, tmp_path: Path) -> None:
    kv = before["advice"]["kv_cache_memory_bytes"]
    after = rerun(tiny_model, tmp_path / "after", kv_cache_memory_bytes=kv)
    _check(f"--kv-cache-memory-bytes {kv}", before, after)


def test_the_admission_levers_are_named_for_this_release(before: dict) -> None:
    """vLLM 0.32 has --max-num-active-seqs (0.31+): the run recorded the server's version, so
    the advice names it, not --max-num-seqs, which would also shrink the runner's buffers; and
    a --watermark share that admits as many as fit at the p95 length. Rerunning the load with
    each (minutes of load apiece) is bench/bench_sizing_levers.py's work, its results in
    docs/sizing.md: CI reruns the memory lever above as the representative check."""
    adv = before["advice"]
    assert adv["concurrency_flag"] == "--max-num-active-seqs"
    assert adv["advised_for"].startswith("vLLM 0.32") and adv["max_num_seqs"] >= 1
    assert any(
        o.startswith(f"--max-num-active-seqs {adv['max_num_seqs']} ") for o in adv["options"]
    )
    w = adv["watermark"]
    assert w is not None and 0 < w < 1
    assert any(o.startswith(f"--watermark {w:g} ") for o in adv["options"])
