"""Attention backends the twin reports to vLLM: the CUDA backends' own classes where they import
on a CPU build, stand-ins with the same kernel block rules where they do not.

vLLM reads a backend's block rules (`get_supported_kernel_block_sizes`,
`get_preferred_block_size`) to pick the block size, and its KV layouts; the twin never runs a
kernel. The choice follows `platforms/cuda.py`'s priorities as kvwatch's sizing encodes them
(`kvplan.PLATFORMS`): FlashAttention (multiples of 16) for attention; for MLA on Hopper,
FLASH_ATTN_MLA (multiples of 16; stood in by TRITON_MLA, which has the same rule) unless the
KV cache is fp8 and no block size is given, then FLASHMLA (64 only); on Blackwell FlashInfer's
MLA (32 or 64, 32 preferred).
"""

from __future__ import annotations

from typing import ClassVar

from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

__all__ = ["FlashInferMlaStandIn", "FlashAttnMlaStandIn", "attention_backend"]


class FlashAttnMlaStandIn(TritonMLABackend):
    """FLASH_ATTN_MLA's block rule (multiples of 16); its kernels need a CUDA build."""

    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN_MLA"


class FlashInferMlaStandIn(TritonMLABackend):
    """FlashInfer MLA's block rule on Blackwell: 32 or 64 tokens, 32 preferred."""

    _sizes: ClassVar[list[int | MultipleOf]] = [32, 64]

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER_MLA"

    @classmethod
    def get_supported_kernel_block_sizes(cls) -> list[int | MultipleOf]:
        return list(cls._sizes)


_FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
_FLASHMLA = "vllm.v1.attention.backends.mla.flashmla.FlashMLABackend"
_TRITON_MLA = "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"


def attention_backend(
    platform: str, use_mla: bool, kv_cache_dtype: str | None, user_block_size: bool
) -> str:
    """The qualname of the backend vLLM on this card would pick, for its block rules."""
    if not use_mla:
        return _FLASH_ATTN
    fp8 = bool(kv_cache_dtype) and str(kv_cache_dtype).startswith("fp8")
    if platform == "cuda-blackwell":
        return f"{__name__}.FlashInferMlaStandIn"
    if platform == "cuda-hopper" and fp8:
        return _TRITON_MLA if user_block_size else _FLASHMLA
    return f"{__name__}.FlashAttnMlaStandIn"
