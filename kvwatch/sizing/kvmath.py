"""What a preemption costs, and the lookups behind the what-if (docs/sizing.md).

The KV layout comes from `kvplan` (vLLM's own planning); this module prices one preemption on
it: the blocks the victim holds, the FLOPs to recompute it (V1), the bytes to swap it (V0, and
CPU offload), and the decode steps to generate it again, the step at the memory-bandwidth
roofline unless given. Pinned by unit tests to the Llama 3.1 8B / H100 example: 128 KiB per
token, 2 MiB per 16-token block, 6.25 new blocks per step at 100 running, 24 TFLOP and 24 ms to
recompute a 1,500-token victim, 94 blocks and 188 MiB to swap it (about 3 ms each way over PCIe
Gen5), 16 GB of weights read per step / 3.35 TB/s = 4.8 ms, about 7.2 s to generate it again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from kvwatch.local.vllm_builder import vllm_installed
from kvwatch.sizing.archconfig import (
    Architecture,
    AttentionLayer,
    MlaLayer,
    architecture_from_config,
    read_config,
)
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import PLATFORMS, KvLayout, Serving, layout_for
from kvwatch.sizing.presets import GPU_ALIASES, GPU_PRESETS, LINK_BYTES_PER_S, MODEL_PRESETS
from kvwatch.sizing.presets import GpuSpec as Gpu
from kvwatch.sizing.vllm_layers import read_vllm_layers, signature

LayerSource = Literal["auto", "vllm", "kvwatch"]
LAYER_SOURCES: tuple[str, ...] = ("auto", "vllm", "kvwatch")

__all__ = [
    "Gpu",
    "VictimCosts",
    "LAYER_SOURCES",
    "LayerSource",
    "architecture_for",
    "model_from_config",
    "lookup_model",
    "lookup_gpu",
    "resolve_model",
    "kv_bytes_per_token",
    "blocks_for",
    "attention_flops",
    "decode_step_s",
    "victim_costs",
]


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(" ", "-")


def lookup_model(name: str, layers: LayerSource = "kvwatch") -> Architecture:
    key = _key(name)
    if key not in MODEL_PRESETS:
        raise SizingError(f"unknown model {name!r}; known: {', '.join(sorted(MODEL_PRESETS))}")
    p = MODEL_PRESETS[key]
    # a preset is a known architecture, held to vLLM by the oracle and the sweep: "auto"
    # reads it with kvwatch's arithmetic, "vllm" asks vLLM all the same
    arch = architecture_for(p.config, key, "kvwatch" if layers == "auto" else layers)
    return _with_params(arch, p.params_total, p.params_active)


def architecture_for(cfg: dict[str, Any], name: str, layers: LayerSource) -> Architecture:
    """A config's model with its layers from `layers`: "kvwatch" (the arithmetic), "vllm"
    (vLLM's own model classes; an error where vLLM is not installed) or "auto" (vLLM's where
    it is installed, else the arithmetic). Where vLLM is installed but cannot build the model
    here, "auto" falls back on the arithmetic for an architecture it knows, and says so."""
    if layers not in LAYER_SOURCES:
        raise SizingError(f"layers from {layers!r}? one of: {', '.join(LAYER_SOURCES)}")
    if layers == "kvwatch" or (layers == "auto" and vllm_installed() is None):
        return architecture_from_config(cfg, name)
    try:
        found = read_vllm_layers(cfg, _label(cfg, name))
    except SizingError as e:
        if layers == "vllm":
            raise
        try:
            arch = architecture_from_config(cfg, name)
        except SizingError:
            raise e from None
        note = f"vLLM could not build it here, so kvwatch's arithmetic sized it: {e}"
        return replace(arch, notes=(*arch.notes, note))
    theirs = architecture_from_config(cfg, name, found.as_built())
    try:
        mine = architecture_from_config(cfg, name)
    except SizingError:
        return theirs
    if signature(mine.layers) != signature(theirs.layers):
        note = (
            f"kvwatch's arithmetic reads this config's layers otherwise than {found.source}; "
            "vLLM's are used"
        )
        return replace(theirs, notes=(*theirs.notes, note))
    # the same layers: the arithmetic's, which also know how each splits across TP ranks
    return replace(
        mine,
        params_total=theirs.params_total,
        params_active=theirs.params_active,
        layers_source=f"kvwatch arithmetic, equal to {found.source}",
    )


def _label(cfg: dict[str, Any], name: str) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0][:80]
    return name


def _with_params(arch: Architecture, total: float, active: float | None) -> Architecture:
    return replace(arch, params_total=total, params_active=active or total)


def lookup_gpu(name: str) -> Gpu:
    key = _key(name)
    key = GPU_ALIASES.get(key, key)
    if key not in GPU_PRESETS:
        raise SizingError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    return GPU_PRESETS[key]


def model_from_config(path: Path, layers: LayerSource = "kvwatch") -> Architecture:
    """A model from its Hugging Face `config.json` (a file or the model directory)."""
    file = path / "config.json" if path.is_dir() else path
    name = file.parent.name or "model"
    return architecture_for(read_config(path), name, layers)


def resolve_model(spec: str, layers: LayerSource = "kvwatch") -> Architecture:
    """`--model`: a config.json or model directory if one is there, else a preset name."""
    p = Path(spec)
    try:
        there = p.exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL: no file, maybe a preset
        there = False
    return model_from_config(p, layers) if there else lookup_model(spec, layers)


def kv_bytes_per_token(arch: Architecture, kv_dtype: str = "auto", tp: int = 1) -> float:
    """Per GPU, at full attention's rate: every layer that keeps this token's K and V (or MLA
    latent), with vLLM's heads per rank (floor of heads / TP, at least one)."""
    return _layout(arch, kv_dtype, tp, 16).bytes_per_token


def _layout(arch: Architecture, kv_dtype: str, tp: int, block_size: int | None) -> KvLayout:
    serving = Serving(max_model_len=1, block_size=block_size, kv_dtype=kv_dtype, tp=tp)
    return layout_for(arch, serving, PLATFORMS["cuda"])


def blocks_for(tokens: float, block_size: int) -> int:
    """Blocks one full-attention sequence of `tokens` occupies (the last one partly filled)."""
    if tokens < 0:
        raise SizingError(f"a sequence length cannot be negative ({tokens})")
    if block_size < 1:
        raise SizingError("block size must be at least 1")
    return math.ceil(tokens / block_size)


def attention_flops(arch: Architecture, tokens: int) -> float:
    """Score and value FLOPs of a prefill of `tokens`: each token attends to what its layer
    keeps (all before it; its window; its chunk), 2 FLOPs a multiply-add."""
    total = 0.0
    t = tokens
    for layer in arch.layers:
        if isinstance(layer, AttentionLayer):
            dims = arch.attention_heads * (layer.head_size + layer.head_size_v)
            if layer.kind == "sliding" and layer.window:
                w = layer.window
                ctx = w * (w + 1) / 2 + max(0, t - w) * w if t > w else t * (t + 1) / 2
            elif layer.kind == "chunked" and layer.window:
                c = layer.window
                full, rest = divmod(t, c)
                ctx = full * c * (c + 1) / 2 + rest * (rest + 1) / 2
            else:
                ctx = t * (t + 1) / 2
        elif isinstance(layer, MlaLayer):
            dims = arch.attention_heads * (layer.qk_head_dim + layer.v_head_dim)
            ctx = t * (t + 1) / 2
        else:
            continue
        total += 2 * dims * ctx
    return total


def decode_step_s(arch: Architecture, gpu: Gpu, tp: int = 1) -> float | None:
    """The decode step at the memory-bandwidth roofline: the active weights read once a step,
    split over the TP ranks (KV reads left out: the seed's idealized step)."""
    if gpu.hbm_bytes_per_s is None:
        return None
    return arch.params_active * arch.weight_bytes_per_param / tp / gpu.hbm_bytes_per_s


@dataclass(frozen=True)
class VictimCosts:
    kv_bytes_per_token: float
    block_bytes: int
    new_blocks_per_step: float
    recompute_flops: float
    attention_flops: float
    recompute_s: float | None
    swap_blocks: int
    swap_bytes: int
    swap_s_each_way: float | None
    step_s: float | None
    step_source: str
    regenerate_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def victim_costs(
    arch: Architecture,
    gpu: Gpu,
    running: float,
    victim_tokens: float,
    layout: KvLayout | None = None,
    tp: int = 1,
    step_s: float | None = None,
    kv_dtype: str = "auto",
    block_size: int = 16,
) -> VictimCosts:
    """What one preemption costs: recompute (V1) against swap (V0) against generating again."""
    if running < 0 or victim_tokens < 0:
        raise SizingError("running requests and victim length must not be negative")
    layout = layout or _layout(arch, kv_dtype, tp, block_size)
    t = math.ceil(victim_tokens)
    flops = victim_tokens * 2 * arch.params_active
    swap_blocks = layout.blocks_per_request(t)
    swap_bytes = swap_blocks * layout.bytes_per_block
    link = LINK_BYTES_PER_S.get(gpu.link or "")
    source = "given"
    if step_s is None:
        step_s, source = decode_step_s(arch, gpu, tp), "roofline"
    return VictimCosts(
        kv_bytes_per_token=layout.bytes_per_token,
        block_bytes=layout.bytes_per_block,
        new_blocks_per_step=running * layout.growth_per_step(t),
        recompute_flops=flops,
        attention_flops=attention_flops(arch, t),
        recompute_s=None if gpu.bf16_flops is None else flops / (gpu.bf16_flops * tp),
        swap_blocks=swap_blocks,
        swap_bytes=swap_bytes,
        swap_s_each_way=None if link is None else swap_bytes / link,
        step_s=step_s,
        step_source=source,
        regenerate_s=None if step_s is None else victim_tokens * step_s,
    )
