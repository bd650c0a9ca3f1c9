"""The twin's capacity is vLLM's, and equals `kvwatch advise --what-if` for the same flags.

The twin's side is vLLM's own planner (`EngineCore._initialize_kv_caches`) over the KV specs of
vLLM's own model classes built on the meta device (tests/twin/probe.py); the what-if is
kvwatch's re-done arithmetic. Where the budget comes from `--gpu-memory-utilization`, both take
the same estimate (`sizing/budget.py`), so those cases check the layer specs, grouping and
block arithmetic, not the budget; the others give `--kv-cache-memory-bytes`.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvwatch.advise.whatif import what_if
from kvwatch.cli import build_parser
from tests.twin.probe import run_probe

pytestmark = pytest.mark.integration
GIB = 2**30

# (id, twin case, what-if flags)
CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("llama-3.1-8b on h100", {"model": "llama-3.1-8b", "gpu": "h100",
     "vllm": {"max_model_len": 8192}}, ["--max-model-len", "8192"]),
    ("llama-3.1-70b TP4 on h100", {"model": "llama-3.1-70b", "gpu": "h100", "tp": 4,
     "vllm": {"max_model_len": 32768}}, ["--tp", "4", "--max-model-len", "32768"]),
    ("gpt-oss-120b on h200", {"model": "gpt-oss-120b", "gpu": "h200",
     "vllm": {"max_model_len": 32768, "gpu_memory_utilization": 0.9}},
     ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]),
    ("gemma-3-27b on h100", {"model": "gemma-3-27b", "gpu": "h100",
     "vllm": {"max_model_len": 32768, "kv_cache_memory_bytes": 30 * GIB}},
     ["--max-model-len", "32768", "--kv-cache-memory-bytes", str(30 * GIB)]),
    ("deepseek-v3 TP8 fp8 on h200 (MLA)", {"model": "deepseek-v3", "gpu": "h200", "tp": 8,
     "vllm": {"max_model_len": 32768, "kv_cache_dtype": "fp8",
              "kv_cache_memory_bytes": 40 * GIB}},
     ["--tp", "8", "--kv-dtype", "fp8", "--max-model-len", "32768",
      "--kv-cache-memory-bytes", str(40 * GIB)]),
    ("qwen3-next on h200 (hybrid)", {"model": "qwen3-next-80b-a3b", "gpu": "h200",
     "vllm": {"max_model_len": 32768, "kv_cache_memory_bytes": 16 * GIB}},
     ["--max-model-len", "32768", "--kv-cache-memory-bytes", str(16 * GIB)]),
    ("llama-3.1-8b on b200, --block-size 32", {"model": "llama-3.1-8b", "gpu": "b200",
     "vllm": {"max_model_len": 16384, "block_size": 32}},
     ["--max-model-len", "16384", "--block-size", "32"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def probed() -> dict[str, dict[str, Any]]:
    return run_probe([dict(case, id=name) for name, case, _ in CASES])


@pytest.mark.parametrize(("name", "case", "flags"), CASES, ids=[c[0] for c in CASES])
def test_the_twin_plans_as_the_what_if(
    probed: dict[str, dict[str, Any]], name: str, case: dict[str, Any], flags: list[str]
) -> None:
    twin = probed[name]
    assert "error" not in twin, twin.get("error")
    ns = build_parser().parse_args(
        ["advise", "--what-if", "--model", case["model"], "--gpu", case["gpu"], *flags]
    )
    w = what_if(ns).to_dict()
    assert twin["num_gpu_blocks"] == w["num_gpu_blocks"]
    assert twin["block_size"] == w["block_size"]
    assert twin["kv_cache_size_tokens"] == w["kv_cache_size_tokens"]
    assert twin["max_concurrency"] == pytest.approx(w["max_concurrency"], rel=1e-9)
    assert twin["capacity_line"] == w["capacity_line"]
    # vLLM took the card's batch defaults and kept CUDA's async scheduling
    assert twin["max_num_batched_tokens"] == w["serving"]["max_num_batched_tokens"]
    assert twin["async_scheduling"] is True
