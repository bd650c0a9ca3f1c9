"""KV cache arithmetic: bytes per token, blocks, and what preemption costs (docs/sizing.md).

Pure functions over plain figures, pinned by unit tests to hand-computed cases and to the
Llama 3.1 8B / H100 example: 128 KiB per token, 2 MiB per 16-token block, 6.25 new blocks per step
at 100 running, 24 TFLOP and 24 ms to recompute a 1,500-token victim, 94 blocks and 188 MiB to
swap it (about 3 ms each way over PCIe Gen5), about 7.2 s to generate it again at 4.8 ms a step.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvwatch.sidecar.sizingerror import SizingError

__all__ = [
    "ModelShape",
    "Gpu",
    "MODELS",
    "GPUS",
    "LINKS",
    "DTYPE_BYTES",
    "SizingError",
    "model_from_config",
    "kv_bytes_per_token",
    "block_bytes",
    "blocks_for",
    "victim_costs",
    "lookup_model",
    "lookup_gpu",
    "VictimCosts",
]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params: float  # total parameters (weights), for memory and recompute FLOPs

    def __post_init__(self) -> None:
        for f in ("layers", "kv_heads", "head_dim", "params"):
            if not getattr(self, f) > 0:
                raise SizingError(f"model {self.name}: {f} must be positive")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: float
    bf16_flops: float  # dense peak
    link: str  # host link for swap


MODELS = {
    m.name: m
    for m in (
        ModelShape("llama-3.1-8b", 32, 8, 128, 8.03e9),
        ModelShape("llama-3.1-70b", 80, 8, 128, 70.6e9),
        ModelShape("llama-3.1-405b", 126, 8, 128, 405.8e9),
        ModelShape("qwen2.5-7b", 28, 4, 128, 7.62e9),
        ModelShape("qwen2.5-32b", 64, 8, 128, 32.8e9),
        ModelShape("qwen2.5-72b", 80, 8, 128, 72.7e9),
        ModelShape("qwen3-8b", 36, 8, 128, 8.19e9),
        ModelShape("mistral-7b", 32, 8, 128, 7.25e9),
        ModelShape("mistral-small-24b", 40, 8, 128, 23.6e9),
    )
}
GPUS = {
    g.name: g
    for g in (
        Gpu("h100", 80e9, 989e12, "pcie5"),
        Gpu("h200", 141e9, 989e12, "pcie5"),
        Gpu("a100", 80e9, 312e12, "pcie4"),
        Gpu("l40s", 48e9, 362e12, "pcie4"),
    )
}
LINKS = {"pcie4": 32e9, "pcie5": 64e9}  # bytes/s each way, x16


_T = TypeVar("_T")


def _lookup(table: dict[str, _T], name: str, what: str) -> _T:
    key = name.lower().replace("_", "-").replace(" ", "-")
    if key not in table:
        raise SizingError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}")
    return table[key]


def lookup_model(name: str) -> ModelShape:
    return _lookup(MODELS, name, "model")


def lookup_gpu(name: str) -> Gpu:
    return _lookup(GPUS, name, "GPU")


def model_from_config(path: Path) -> ModelShape:
    """A model's shape from its Hugging Face `config.json` (a file or the model directory)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text())
    except OSError as e:
        raise SizingError(f"cannot read {file}: {e.strerror}") from None
    except ValueError as e:
        raise SizingError(f"{file} is not JSON: {e}") from None
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model
    missing = [
        k
        for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")
        if not isinstance(cfg.get(k), int)
    ]
    if missing:
        raise SizingError(f"{file} lacks {', '.join(missing)} (needed for KV size)")
    layers, hidden, heads = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg.get("intermediate_size") or 4 * hidden
    vocab = cfg.get("vocab_size") or 32000
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    params = layers * (attn + 3 * hidden * inter) + vocab * hidden * (
        1 if cfg.get("tie_word_embeddings") else 2
    )
    return ModelShape(file.parent.name or "model", layers, kv_heads, head_dim, float(params))


def kv_bytes_per_token(model: ModelShape, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """Per GPU: 2 (K and V) x layers x KV heads on this rank x head dim x bytes per element.

    With more tensor-parallel ranks than KV heads, vLLM replicates heads: one per rank.
    """
    if kv_dtype not in DTYPE_BYTES:
        raise SizingError(f"unknown KV dtype {kv_dtype!r}; one of {', '.join(DTYPE_BYTES)}")
    if tp < 1:
        raise SizingError("tensor-parallel size must be at least 1")
    heads = max(1, math.ceil(model.kv_heads / tp))
    return model.layers * 2 * heads * model.head_dim * DTYPE_BYTES[kv_dtype]


def block_bytes(bytes_per_token: int, block_size: int) -> int:
    if block_size < 1:
        raise SizingError("block size must be at least 1")
    return bytes_per_token * block_size


def blocks_for(tokens: float, block_size: int) -> int:
    """Blocks one sequence of `tokens` occupies (the last one partly filled)."""
    if tokens < 0:
        raise SizingError(f"a sequence length cannot be negative ({tokens})")
    return math.ceil(tokens / block_size)


@dataclass(frozen=True)
class VictimCosts:
    kv_bytes_per_token: int
    block_bytes: int
    new_blocks_per_step: float
    recompute_flops: float
    recompute_s: float
    swap_blocks: int
    swap_bytes: int
    swap_s_each_way: float
    regenerate_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def victim_costs(
    model: ModelShape,
    gpu: Gpu,
    running: float,
    victim_tokens: float,
    block_size: int = 16,
    kv_dtype: str = "bf16",
    tp: int = 1,
    step_s: float | None = None,
) -> VictimCosts:
    """What one preemption costs: recompute (V1) against swap (V0) against generating again."""
    if running < 0 or victim_tokens < 0:
        raise SizingError("running requests and victim length must not be negative")
    bpt = kv_bytes_per_token(model, kv_dtype, tp)
    bb = block_bytes(bpt, block_size)
    flops = victim_tokens * 2 * model.params
    swap_blocks = blocks_for(victim_tokens, block_size)
    swap_bytes = swap_blocks * bb
    return VictimCosts(
        kv_bytes_per_token=bpt,
        block_bytes=bb,
        new_blocks_per_step=running / block_size,
        recompute_flops=flops,
        recompute_s=flops / (gpu.bf16_flops * tp),
        swap_blocks=swap_blocks,
        swap_bytes=swap_bytes,
        swap_s_each_way=swap_bytes / LINKS[gpu.link],
        regenerate_s=None if step_s is None else victim_tokens * step_s,
    )
