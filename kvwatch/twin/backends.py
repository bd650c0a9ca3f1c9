"""Attention backends the twin reports to vLLM: the CUDA backends' own classes for their block
rules and KV layouts, with an implementation that runs no kernel.

vLLM reads a backend's block rules (`get_supported_kernel_block_sizes`,
`get_preferred_block_size`) to pick the block size, and its KV layouts; an attention layer also
builds the backend's implementation, whose CUDA kernels are not in a CPU build. Each stand-in
subclasses the real backend (where it imports on a CPU build) and swaps in `NoKernel`. The
choice follows `platforms/cuda.py`'s priorities as kvwatch's sizing encodes them
(`kvplan.PLATFORMS`): FlashAttention (multiples of 16) for attention; for MLA on Hopper,
FLASH_ATTN_MLA (multiples of 16, the rule TRITON_MLA has) unless the KV cache is fp8 and no block
size is given, then FLASHMLA (64 only); on Blackwell FlashInfer's MLA (32 or 64, 32 preferred).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.attention.backend import AttentionImpl, MultipleOf
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

__all__ = [
    "NoKernel",
    "FlashAttnStandIn",
    "FlashMlaStandIn",
    "TritonMlaStandIn",
    "FlashAttnMlaStandIn",
    "FlashInferMlaStandIn",
    "attention_backend",
]


class NoKernel(AttentionImpl[Any]):
    """An attention implementation for a model that never runs: it keeps the shapes vLLM reads
    when it prints a layer and raises if asked to compute."""

    def __init__(self, num_heads: int, head_size: int, scale: float, *args: Any, **kw: Any) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = kw.get("num_kv_heads", args[0] if args else num_heads)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the kvwatch twin computes no attention")


class FlashAttnStandIn(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[NoKernel]:  # type: ignore[override]
        return NoKernel


class FlashMlaStandIn(FlashMLABackend):
    @staticmethod
    def get_impl_cls() -> type[NoKernel]:  # type: ignore[override]
        return NoKernel


class TritonMlaStandIn(TritonMLABackend):
    @staticmethod
    def get_impl_cls() -> type[NoKernel]:  # type: ignore[override]
        return NoKernel


class FlashAttnMlaStandIn(TritonMlaStandIn):
    """FLASH_ATTN_MLA: multiples of 16, as TRITON_MLA; its kernels need a CUDA build."""

    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN_MLA"


class FlashInferMlaStandIn(TritonMlaStandIn):
    """FlashInfer's MLA on Blackwell: 32 or 64 tokens, 32 preferred."""

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER_MLA"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [32, 64]


def attention_backend(
    platform: str, use_mla: bool, kv_cache_dtype: str | None, user_block_size: bool
) -> str:
    """The qualname of the stand-in for the backend vLLM on this card would pick."""
    here = __name__
    if not use_mla:
        return f"{here}.FlashAttnStandIn"
    fp8 = bool(kv_cache_dtype) and str(kv_cache_dtype).startswith("fp8")
    if platform == "cuda-blackwell":
        return f"{here}.FlashInferMlaStandIn"
    if platform == "cuda-hopper" and fp8:
        return f"{here}.TritonMlaStandIn" if user_block_size else f"{here}.FlashMlaStandIn"
    return f"{here}.FlashAttnMlaStandIn"
