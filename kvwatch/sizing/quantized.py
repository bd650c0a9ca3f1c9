"""Bytes per parameter of a checkpoint as it is stored: which weights its quantization method
stores in fewer bits, and which stay at the model's dtype.

vLLM measures the weights it loaded; kvwatch has only config.json, so it reads the
`quantization_config` the way vLLM's quantization methods treat a model: the linear layers are
quantized, the embeddings and the LM head are not (no method in vLLM quantizes
`VocabParallelEmbedding`; `ParallelLMHead` stays unquantized unless a method says so), and the
modules the config names in `modules_to_not_convert` / `ignore` / `ignored_layers` stay at the
dtype. Meta's own FP8 Llamas (`fbgemm_fp8`) leave attention and the first and last layers'
MLPs in bf16 that way: vLLM loaded meta-llama/Llama-3.1-405B-FP8 in 56.77 GiB a card at TP 8
(dstackai/benchmarks, comparison/h100sxm5_vs_mi300x/raw_data/gpu-usage.md), 47.2 GiB at one byte
a parameter. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ParamCounts", "method_bytes", "weight_bytes_per_param"]

# bytes per parameter of each method's quantized weights, scales included: fp8 one byte (a
# scale per channel or 128x128 block is noise); MXFP4 4 bits + an 8-bit scale per 32; NVFP4
# 4 bits + an fp8 scale per 16; bitsandbytes nf4 4 bits + a scale per 64
_FIXED = {
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "ptpc_fp8": 1.0,
    "fp_quant": 1.0,
    "mxfp4": 4.25 / 8,
    "mxfp8": 8.25 / 8,
    "nvfp4": 4.5 / 8,
    "modelopt_fp4": 4.5 / 8,
}
_GROUPED = ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round")
# where each method's config names the modules it leaves at the dtype (HF, compressed-tensors,
# vLLM's fp8, ModelOpt, Quark)
_NOT_CONVERTED = (
    "modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules", "exclude"
)  # fmt: skip
_LAYER = re.compile(r"layers?\.(\d+)\.")
_ATTN_PROJ = {"q_proj": "q", "o_proj": "o", "k_proj": "k", "v_proj": "v", "qkv_proj": "qkv"}


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters by where a quantization method may leave them at the dtype."""

    total: float
    embeddings: float  # the input embedding (vocab x hidden)
    lm_head: float  # 0 where it is tied to the embedding
    attention: Sequence[float]  # per layer
    mlp: Sequence[float]  # per layer (every expert of a MoE layer)
    heads: int = 1  # query heads, to split an attention layer by projection
    kv_heads: Sequence[int] = ()  # per layer


def method_bytes(quant: Mapping[str, Any]) -> float | None:
    """Bytes per quantized parameter of this `quantization_config`; None: a method kvwatch does
    not know (the caller counts the weights at the dtype and says so)."""
    method = str(quant.get("quant_method") or "").lower()
    if method in _FIXED:
        return _FIXED[method]
    if method == "modelopt":
        inner = quant.get("quantization")
        algo = str(
            quant.get("quant_algo")
            or (inner.get("quant_algo", "") if isinstance(inner, Mapping) else "")
        )
        return _FIXED["nvfp4"] if "FP4" in algo.upper() else 1.0
    if method in _GROUPED:
        bits = _bits(quant.get("bits") or quant.get("w_bit"), 4)
        group = _group(quant.get("group_size", quant.get("q_group_size", 128)))
        # a 16-bit scale (and a packed zero point) per group of `group` weights; -1: one scale
        # per output channel
        return bits / 8 + ((2 + bits / 8) / group if group else 0.0)
    if method == "bitsandbytes":
        return 1.0 if quant.get("load_in_8bit") else 0.53
    if method == "quark":  # AMD's: the global weight spec's dtype
        spec = quant.get("global_quant_config")
        weight = spec.get("weight") if isinstance(spec, Mapping) else None
        dtype = str(weight.get("dtype", "") if isinstance(weight, Mapping) else "").lower()
        if "fp8" in dtype or "int8" in dtype:
            return 1.0
        if "fp4" in dtype or "int4" in dtype:
            return _FIXED["mxfp4"]
        return None
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        if isinstance(groups, Mapping):
            for g in groups.values():
                w = g.get("weights") if isinstance(g, Mapping) else None
                if isinstance(w, Mapping) and w.get("num_bits"):
                    bits = _bits(w.get("num_bits"), 8)
                    group = _group(w.get("group_size"))
                    return bits / 8 + (2 / group if group else 0.0)
        return None
    return None


def weight_bytes_per_param(
    quant: Mapping[str, Any] | None, dtype_bytes: float, counts: ParamCounts | None
) -> tuple[float, list[str]]:
    """Bytes per parameter over the whole model, and notes for what could not be read."""
    if not quant or not quant.get("quant_method"):
        return float(dtype_bytes), []
    qbytes = method_bytes(quant)
    name = str(quant.get("quant_method"))[:40]
    if qbytes is None:
        return float(dtype_bytes), [
            f"quantization {name!r} is not one kvwatch reads: weights counted at the model's dtype"
        ]
    if counts is None or counts.total <= 0:
        return qbytes, []
    kept, unread = _kept(quant, counts)
    kept = min(kept, counts.total)
    notes = (
        [f"{unread} of the modules {name} leaves unquantized were not read (counted quantized)"]
        if unread
        else []
    )
    return (kept * dtype_bytes + (counts.total - kept) * qbytes) / counts.total, notes


def _kept(quant: Mapping[str, Any], c: ParamCounts) -> tuple[float, int]:
    """Parameters left at the dtype: embeddings, the LM head, the named modules."""
    attn: dict[int, set[str]] = {}
    mlp: dict[int, float] = {}
    unread = 0
    n = len(c.attention)
    for key in _NOT_CONVERTED:
        names = quant.get(key)
        if not isinstance(names, list):
            continue
        for raw in names:
            entry = str(raw).removeprefix("re:")
            if "lm_head" in entry or "embed" in entry:
                continue  # kept already
            if "router" in entry or entry.endswith((".gate", "shared_expert_gate")):
                continue  # a MoE router: a hidden x experts matrix, nothing beside the experts
            m = _LAYER.search(entry)
            layers = [int(m.group(1))] if m else range(n)
            layers = [i for i in layers if 0 <= i < n]
            if "attn" in entry or "attention" in entry:
                proj = next((v for k, v in _ATTN_PROJ.items() if k in entry), "all")
                for i in layers:
                    attn.setdefault(i, set()).add(proj)
            elif "mlp" in entry or "expert" in entry or "feed_forward" in entry:
                share = 2 / 3 if "gate_up" in entry else 1 / 3 if "_proj" in entry else 1.0
                for i in layers:
                    mlp[i] = min(1.0, mlp.get(i, 0.0) + share)
            else:
                unread += 1
    kept = c.embeddings + c.lm_head
    kept += sum(c.attention[i] * _attn_share(projs, c, i) for i, projs in attn.items())
    kept += sum(c.mlp[i] * share for i, share in mlp.items())
    return kept, unread


def _attn_share(projs: set[str], c: ParamCounts, i: int) -> float:
    """The share of layer i's attention parameters in the named projections (q and o: the
    query heads each; k and v: the KV heads each)."""
    if "all" in projs:
        return 1.0
    q = float(c.heads)
    kv = float(c.kv_heads[i]) if i < len(c.kv_heads) and c.kv_heads[i] else q
    weight = {"q": q, "o": q, "k": kv, "v": kv, "qkv": q + 2 * kv}
    return min(1.0, sum(weight[p] for p in projs) / (2 * q + 2 * kv))


def _bits(v: Any, default: float) -> float:
    """Bits a weight: 1 to 32; `default` for anything else."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and 1 <= v <= 32
    return float(v) if ok else default


def _group(v: Any) -> int:
    """Weights per scale; 0 for none (per channel, or not a count)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
