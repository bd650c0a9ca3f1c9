"""An MLA model's block size on CUDA GPUs, per vLLM's backend choice (platforms/cuda.py).

On Hopper, FLASH_ATTN_MLA comes first for MLA but keeps no fp8 cache, so an fp8 KV cache goes to
FLASHMLA, whose kernel takes 64-token blocks only: without --block-size vLLM then runs 64-token
blocks (half as many blocks of twice the size, and a request rounds up to 64 tokens). With
--block-size 16 FLASHMLA is passed over for TRITON_MLA and the 16 stays. Ampere has neither
FLASH_ATTN_MLA nor FLASHMLA (SM90+): TRITON_MLA, 16. The CUDA platform cannot be imported on this
CPU build, so the oracle here is vLLM's source and the backend classes that do import.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.sizing.kvplan import PLATFORMS, Serving, plan

GIB = 2**30


def _plan(gpu: str, kv_dtype: str, block_size: int | None = None):  # type: ignore[no-untyped-def]
    serving = Serving(max_model_len=32768, kv_dtype=kv_dtype, block_size=block_size, tp=8)
    return plan(lookup_model("deepseek-v3"), serving, PLATFORMS[lookup_gpu(gpu).platform], 40 * GIB)


@pytest.mark.parametrize(
    ("gpu", "kv_dtype", "block_size", "expected"),
    [
        ("h100", "fp8", None, 64),  # FLASHMLA
        ("h200", "fp8", None, 64),
        ("h100", "fp8", 16, 16),  # TRITON_MLA keeps the user's 16
        ("h100", "auto", None, 16),  # FLASH_ATTN_MLA
        ("a100", "fp8", None, 16),  # TRITON_MLA
        ("b200", "fp8", None, 32),  # FLASHINFER_MLA prefers 32
    ],
)
def test_the_block_size_follows_the_backend_vllm_picks(
    gpu: str, kv_dtype: str, block_size: int | None, expected: int
) -> None:
    p = _plan(gpu, kv_dtype, block_size)
    assert p.layout.block_size == expected


def test_hopper_fp8_says_why_its_blocks_are_64_tokens() -> None:
    fp8, bf16 = _plan("h100", "fp8"), _plan("h100", "auto")
    assert any("64-token blocks" in n for n in fp8.layout.notes), fp8.layout.notes
    # a 64-token block of fp8 latents holds twice the bytes of a 16-token bf16 one: fp8 still
    # doubles the tokens, but a request now rounds up to 64 tokens
    assert fp8.kv_cache_size_tokens == pytest.approx(2 * bf16.kv_cache_size_tokens, rel=0.01)


def _vllm_file(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / relative


def _kv_dtypes(source: Path, cls: str) -> list[str]:
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    for stmt in node.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id == "supported_kv_cache_dtypes"
        ):
            return list(ast.literal_eval(stmt.value))  # type: ignore[arg-type]
    raise AssertionError(f"{cls} names no supported_kv_cache_dtypes")


def test_the_rule_is_vllms() -> None:
    """The installed vLLM's priorities for SM80/SM90 MLA, and each backend's dtypes and blocks."""
    cuda = re.sub(r"\s+", " ", _vllm_file("platforms/cuda.py").read_text())
    order = (
        "return [ AttentionBackendEnum.FLASH_ATTN_MLA, AttentionBackendEnum.FLASHMLA, "
        "AttentionBackendEnum.FLASHINFER_MLA, AttentionBackendEnum.TRITON_MLA,"
    )
    assert order in cuda
    fa_mla = _vllm_file("v1/attention/backends/mla/flashattn_mla.py")
    assert not any(d.startswith("fp8") for d in _kv_dtypes(fa_mla, "FlashAttnMLABackend"))
    assert "return capability.major == 9" in fa_mla.read_text()  # Hopper only
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    flashmla = AttentionBackendEnum.FLASHMLA.get_class()
    assert "fp8" in flashmla.supported_kv_cache_dtypes
    assert flashmla.get_preferred_block_size(16) == 64 and not flashmla.supports_block_size(16)
    assert not flashmla.supports_compute_capability(DeviceCapability(8, 0))
    triton = AttentionBackendEnum.TRITON_MLA.get_class()
    assert "fp8" in triton.supported_kv_cache_dtypes and triton.get_preferred_block_size(16) == 16
