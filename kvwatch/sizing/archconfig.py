"""A model's KV-relevant shape, read from its Hugging Face `config.json` the way vLLM reads it.

Each decoder layer becomes one `Layer`: full attention, sliding window, chunked local, MLA,
a recurrent state (Mamba2, gated delta net), or none. The rules follow vLLM 0.32's model files
and config code (docs/sizing.md), not what a config seems to say: Qwen's `sliding_window` counts
only with `use_sliding_window`, gpt-oss slides on even layers, Gemma 3 derives its pattern,
a model-wide window applies only when no layer says otherwise, and `sliding_window: 0` means none.
A config whose layers cannot be told raises `SizingError` naming the architecture and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.quantized import ParamCounts, weight_bytes_per_param

__all__ = [
    "AttentionLayer",
    "MlaLayer",
    "StateLayer",
    "Layer",
    "Architecture",
    "BuiltModel",
    "architecture_from_config",
    "known_arithmetic",
    "refuse_attention_free",
    "read_config",
]

AttentionKind = Literal["full", "sliding", "chunked"]


@dataclass(frozen=True)
class AttentionLayer:
    """K and V per token per KV head; `window` is the sliding window or the chunk size."""

    kind: AttentionKind
    kv_heads: int
    head_size: int
    head_size_v: int
    window: int | None = None
    pinned_bytes: int = 0  # bytes per element where the model file ignores --kv-cache-dtype


@dataclass(frozen=True)
class MlaLayer:
    """One latent per token (kv_lora_rank + qk_rope_head_dim), no heads, the same on every rank."""

    latent: int
    qk_head_dim: int = 0  # nope + rope, for the attention FLOPs of a prefill
    v_head_dim: int = 0


@dataclass(frozen=True)
class StateLayer:
    """A fixed recurrent state per request: a convolution state and an SSM state.

    conv: `conv_dim` channels x `conv_len` positions, split across TP ranks.
    ssm: `ssm_heads` x `ssm_a` x `ssm_b`, heads split across TP ranks (Mamba2 also extends its
    groups to cover the head shards, `mamba_groups`). `checkpoint_blocks`: Mamba2's mixer keeps
    one more block per request when prefix caching aligns its state (vLLM's mamba_mixer2).
    kind "vllm": the state vLLM's own spec gave for one unsharded rank (`vllm_layers.py`):
    `conv_channels` conv elements and `ssm_b` state elements, of the mixer `mixer`.
    """

    kind: Literal["mamba1", "mamba2", "gdn", "short_conv", "vllm"]
    conv_channels: int  # before group extension (Mamba2: intermediate; GDN: the whole conv)
    conv_len: int
    ssm_heads: int
    ssm_a: int
    ssm_b: int
    mamba_groups: int = 0
    mamba_state: int = 0
    checkpoint_blocks: int = 0
    mixer: str = ""
    fixed_bytes: int = 0  # state in a dtype its model file pins (kind "vllm", one rank)

    def shapes(self, tp: int) -> tuple[int, int]:
        """(conv elements, ssm elements) per request on one TP rank."""
        if self.kind == "vllm" and tp != 1:
            raise SizingError(
                f"vLLM's specs give a {self.mixer} state for one unsharded rank; how it splits "
                f"across {tp} TP ranks is the model's own: size it at --tp 1"
            )
        channels = self.conv_channels
        if self.kind == "mamba2":
            groups = self.mamba_groups
            if groups % tp:
                groups += tp - groups  # vLLM's extra_groups_for_head_shards
            channels += 2 * groups * self.mamba_state
        if channels % tp or self.ssm_heads % tp:
            raise SizingError(
                f"a {self.kind} layer with {channels} conv channels and {self.ssm_heads} heads "
                f"does not split across {tp} tensor-parallel ranks"
            )
        return channels // tp * self.conv_len, self.ssm_heads // tp * self.ssm_a * self.ssm_b


Layer = AttentionLayer | MlaLayer | StateLayer | None


@dataclass(frozen=True)
class Architecture:
    """What sizing needs of one model: its layers and its weights."""

    name: str
    architecture: str
    layers: tuple[Layer, ...]
    hidden_size: int
    attention_heads: int
    params_total: float
    params_active: float  # per token: routed experts per token plus the shared ones
    dtype_bytes: int = 2  # torch_dtype: what vLLM's "auto" KV dtype and Mamba conv state use
    weight_bytes_per_param: float = 2.0  # after quantization (fp8 checkpoints: 1)
    max_position_embeddings: int | None = None  # vLLM's default max_model_len
    notes: tuple[str, ...] = field(default_factory=tuple)
    moe_routed_share: float = 0.0  # MoE: experts per token over routed experts (k/E); 0: dense
    mlp_width: int = 0  # the widest MLP a token passes (dense, or its experts side by side)
    vocab_size: int = 0
    moe_layers: int = 0  # layers whose MLP is routed experts (the step model's per-layer cost)
    layers_source: str = "kvwatch arithmetic"  # or "vllm <version> model classes"
    state_dtype: str | None = None  # the SSM state dtype the config pins for "auto"

    @property
    def uses_mla(self) -> bool:
        return any(isinstance(x, MlaLayer) for x in self.layers)

    @property
    def is_hybrid(self) -> bool:
        return any(isinstance(x, StateLayer) for x in self.layers)

    @property
    def weight_bytes(self) -> float:
        return self.params_total * self.weight_bytes_per_param

    def kinds(self) -> dict[str, int]:
        """How many layers of each kind, for messages and docs."""
        out: dict[str, int] = {}
        for x in self.layers:
            k = _kind_name(x)
            out[k] = out.get(k, 0) + 1
        return out


def _kind_name(x: Layer) -> str:
    if isinstance(x, AttentionLayer):
        return x.kind if x.window is None else f"{x.kind} {x.window}"
    if isinstance(x, MlaLayer):
        return "mla"
    if isinstance(x, StateLayer):
        return x.mixer or x.kind
    return "none"


def read_config(path: Path) -> dict[str, Any]:
    """A config.json (a file or a model directory) as a dict, or a SizingError saying why not."""
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text())
    except OSError as e:
        raise SizingError(f"cannot read {file}: {e.strerror}") from None
    except ValueError as e:
        raise SizingError(f"{file} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise SizingError(f"{file} is not a JSON object")
    return cfg


# Architectures whose layers kvwatch reads as vLLM's model files do (full attention unless the
# fields read below say otherwise); tests/sizing/test_oracle.py runs vLLM on one of each kind.
_KNOWN = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
    "GraniteForCausalLM",
    "GraniteMoeForCausalLM",
    "OlmoForCausalLM",
    "Olmo2ForCausalLM",
    "InternLM2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Cohere2ForCausalLM",
    "GptOssForCausalLM",
    "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK2ForCausalLM",
    "Qwen3NextForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "NemotronHForCausalLM",
    # added with the registry sweep (bench/bench_arch_sweep.py), each equal to vLLM's specs
    "GemmaForCausalLM",
    "Glm4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM",
    "HyperCLOVAXForCausalLM",
    "MiniMaxM2ForCausalLM",
    "Ministral3ForCausalLM",
    "Exaone4ForCausalLM",
    "OlmoeForCausalLM",
    "StableLmForCausalLM",
    "GraniteMoeSharedForCausalLM",
    "GraniteSWAForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "FalconForCausalLM",
    "JambaForCausalLM",
    "FalconH1ForCausalLM",
    "Zamba2ForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "Gemma3nForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    # served through vLLM's Transformers backend: generic heads, head size and layer_types
    "PhiForCausalLM",
    "Starcoder2ForCausalLM",
    "SmolLM3ForCausalLM",
    "Olmo3ForCausalLM",
    "GlmForCausalLM",
    "ArceeForCausalLM",
    "SeedOssForCausalLM",
    "GPTNeoXForCausalLM",
    "FlexOlmoForCausalLM",
    "Jais2ForCausalLM",
    "MellumForCausalLM",
}
# vLLM's model files that take the head size from hidden_size / heads, whatever head_dim says
_HEAD_FROM_HIDDEN = {
    "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM", "GraniteMoeSWAForCausalLM",
    "OlmoeForCausalLM", "StableLmForCausalLM", "FalconForCausalLM", "JambaForCausalLM",
    "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
}  # fmt: skip
# bounds past any model served today: a config beyond them is broken, not big
_MAX_LAYERS = 4096
_MAX_WIDTH = 1 << 20

# model types whose config carries no `architectures` list, read as the architecture above
_KNOWN_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
    "granite", "granitemoe", "olmo", "olmo2", "gemma2", "gemma3", "gemma3_text", "cohere2",
    "gpt_oss", "llama4", "llama4_text", "deepseek_v2", "deepseek_v3", "kimi_k2", "qwen3_next",
    "granitemoehybrid", "nemotron_h", "gemma", "glm4", "glm4_moe", "ernie4_5", "ernie4_5_moe",
    "minimax_m2", "ministral3", "exaone4", "olmoe", "stablelm", "granitemoeshared", "falcon",
    "jamba", "falcon_h1", "zamba2", "lfm2", "lfm2_moe", "gemma3n_text", "qwen3_5_text",
    "qwen3_5_moe_text", "phi", "starcoder2", "smollm3", "olmo3", "glm", "arcee", "seed_oss",
    "gpt_neox", "flex_olmo", "jais2", "mellum",
}  # fmt: skip


def _int(cfg: Mapping[str, Any], key: str, arch: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        if v is None:
            raise SizingError(f"{arch}: config.json lacks {key} (needed for the KV layout)")
        raise SizingError(f"{arch}: {key} must be a non-negative integer, not {v!r}")
    return v


def _opt_int(cfg: Mapping[str, Any], key: str, arch: str) -> int | None:
    v = cfg.get(key)
    if v is None:
        return None
    return _int(cfg, key, arch)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM sizes the language model; multimodal configs nest it under `text_config`."""
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        merged.setdefault("torch_dtype", cfg.get("torch_dtype"))
        return merged
    return cfg


@dataclass(frozen=True)
class BuiltModel:
    """What vLLM's own model classes said of a config (`vllm_layers.py`): its KV layers, in
    vLLM's order, and the shape and parameter count of the model it built."""

    layers: tuple[Layer, ...]
    hidden_size: int
    attention_heads: int
    params: int
    source: str  # "vllm <version> model classes"


def architecture_from_config(
    cfg: dict[str, Any], name: str = "model", built: BuiltModel | None = None
) -> Architecture:
    """The model vLLM would build from this config.json, as KV layers and parameter counts.
    Its layers are kvwatch's reading of the config, or vLLM's own (`built`) where given."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    text = _text_config(cfg)
    model_type = str(text.get("model_type") or cfg.get("model_type") or "")
    # a label for messages: one line, short, whatever the config holds
    label = " ".join((arch or model_type or name).split())[:80] or "model"
    notes: list[str] = []
    if built is None:
        known_arithmetic(arch, model_type, label)
        n_layers = _int(text, "num_hidden_layers", label)
        hidden = _int(text, "hidden_size", label)
        heads = _int(text, "num_attention_heads", label)
        if not (n_layers and hidden and heads):
            raise SizingError(
                f"{label}: num_hidden_layers, hidden_size and num_attention_heads must be positive"
            )
        if n_layers > _MAX_LAYERS or hidden > _MAX_WIDTH or heads > _MAX_WIDTH:
            raise SizingError(
                f"{label}: {n_layers} layers of {hidden} over {heads} heads is no model "
                f"(at most {_MAX_LAYERS} layers, {_MAX_WIDTH} wide)"
            )
        kinds = _layer_kinds(text, arch, model_type, n_layers, label, notes)
        layers = tuple(_build_layer(k, text, label, heads, hidden, arch) for k in kinds)
    else:
        layers, hidden, heads = built.layers, built.hidden_size, built.attention_heads
    refuse_attention_free(layers, label)
    counts: ParamCounts | None = None
    try:
        counts, active = _params(text, layers, label)
        total = counts.total
    except (KeyError, TypeError, ValueError, ZeroDivisionError, SizingError):
        if built is None:
            raise
        total = active = float(built.params)
    if built is not None and built.params and total:
        # vLLM's count is exact (the built model's tensors); the config's MoE fields say
        # how much of it a token passes
        active, total = active / total * built.params, float(built.params)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "bfloat16")
    dbytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 2)
    quant = cfg.get("quantization_config")
    wbytes, quant_notes = weight_bytes_per_param(
        quant if isinstance(quant, dict) else None, dbytes, counts
    )
    notes += quant_notes
    return Architecture(
        name=name,
        architecture=label,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        params_total=total,
        params_active=active,
        dtype_bytes=dbytes,
        weight_bytes_per_param=wbytes,
        max_position_embeddings=_opt_int(text, "max_position_embeddings", label),
        notes=tuple(notes),
        moe_routed_share=_routed_share(text),
        mlp_width=_mlp_width(text),
        vocab_size=_size(text.get("vocab_size") or 0),
        moe_layers=sum(_moe_layer_flags(text, len(layers))),
        layers_source=built.source if built is not None else "kvwatch arithmetic",
        state_dtype=_state_dtype(text, model_type),
    )


def _state_dtype(text: Mapping[str, Any], model_type: str) -> str | None:
    """vLLM's models/config.py: NemotronH's "auto" SSM state is the config's
    `mamba_ssm_cache_dtype`, float32 when absent; Qwen3.5's is its `mamba_ssm_dtype`."""
    if model_type == "nemotron_h":
        return str(text.get("mamba_ssm_cache_dtype") or "float32")
    if model_type.startswith("qwen3_5"):
        v = text.get("mamba_ssm_dtype")
        return str(v) if v else None
    return None


def refuse_attention_free(layers: tuple[Layer, ...], label: str) -> None:
    """A model of recurrent state only (Mamba, or a hybrid config with no attention layer
    left): vLLM sizes its cache per request with its own block size, which kvwatch's
    block arithmetic has not been held to; refused rather than sized."""
    if any(isinstance(x, StateLayer) for x in layers) and not any(
        isinstance(x, AttentionLayer | MlaLayer) for x in layers
    ):
        raise SizingError(
            f"{label}: attention-free (recurrent state only): vLLM sizes it per request, not "
            "in token blocks, and kvwatch does not size such models"
        )


def known_arithmetic(arch: str, model_type: str, label: str) -> None:
    """A SizingError, in one short line, for a config whose architecture kvwatch's own
    arithmetic has not been held to vLLM for: its fields may look dense and not be."""
    if arch in _KNOWN or (not arch and model_type in _KNOWN_TYPES):
        return
    if not (arch or model_type):
        raise SizingError(
            f"{label}: config.json names no architecture (neither architectures nor model_type)"
        )
    raise SizingError(
        f"{label}: not an architecture kvwatch's arithmetic knows; install vLLM "
        "(kvwatch[gpu]) to size it from vLLM's model classes, or use a known --model preset"
    )


def _sliding_window(text: Mapping[str, Any], model_type: str, label: str) -> int | None:
    w = _opt_int(text, "sliding_window", label)
    if w == 0:
        return None  # vLLM: 0 means disabled
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not text.get(
        "use_sliding_window", False
    ):
        return None  # transformers drops the window unless use_sliding_window
    return w


def _layer_kinds(
    text: Mapping[str, Any],
    arch: str,
    model_type: str,
    n: int,
    label: str,
    notes: list[str],
) -> list[str]:
    """One of full / sliding / chunked / mla / mamba2 / gdn / none per decoder layer."""
    if text.get("kv_lora_rank"):
        return ["mla"] * n
    if model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text") or arch in (
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    ):  # fmt: skip
        types = text.get("layer_types")
        if not isinstance(types, list):
            interval = _int(text, "full_attention_interval", label, 4) or 4
            types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(n)
            ]
        return [_hybrid_kind(t, label) for t in _sized(types, n, "layer_types", label)]
    if arch == "GraniteMoeHybridForCausalLM" or model_type == "granitemoehybrid":
        types = text.get("layer_types") or text.get("layers_block_type")
        if not isinstance(types, list):
            raise SizingError(f"{label}: config.json lacks layer_types (which layers are Mamba)")
        # transformers names Granite 4's Mamba layers "linear_attention" (older configs say
        # "mamba"); vLLM's granitemoehybrid.py builds a Mamba2 mixer for either
        return [
            "mamba2" if t == "linear_attention" else _hybrid_kind(t, label)
            for t in _sized(types, n, "layer_types", label)
        ]
    special = _family_kinds(text, arch, model_type, n, label)
    if special is not None:
        return special
    if arch == "NemotronHForCausalLM" or model_type == "nemotron_h":
        pattern = text.get("hybrid_override_pattern")
        if not isinstance(pattern, str):
            raise SizingError(f"{label}: config.json lacks hybrid_override_pattern")
        m = {"M": "mamba2", "*": "full", "-": "none", "E": "none"}
        if any(c not in m for c in pattern):
            raise SizingError(f"{label}: hybrid_override_pattern {pattern!r} has unknown layers")
        return [m[c] for c in _sized(list(pattern), n, "hybrid_override_pattern", label)]
    window = _sliding_window(text, model_type, label)
    chunk = _opt_int(text, "attention_chunk_size", label)
    if chunk and model_type.startswith("llama4"):
        rope = text.get("no_rope_layers")
        if not isinstance(rope, list) or not rope:
            step = _int(text, "no_rope_layer_interval", label, 4) or 4
            rope = [int((i + 1) % step != 0) for i in range(n)]
        # vLLM: chunked local attention on RoPE layers, full attention on the NoPE ones
        return ["chunked" if r else "full" for r in _sized(rope, n, "no_rope_layers", label)]
    if window is None:
        return _shared_kv(text, model_type, ["full"] * n, label)
    if model_type == "gpt_oss" or arch == "GptOssForCausalLM":
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]  # vLLM's gpt_oss.py
    types = text.get("layer_types")
    if not (isinstance(types, list) and types):
        types = _transformers_layer_types(text, model_type, n, label, notes)
    if types:
        _refused_mix(text, model_type, types, label)
        kinds = [
            "sliding" if t == "sliding_attention" else "full"
            for t in _sized(types, n, "layer_types", label)
        ]
        return _shared_kv(text, model_type, kinds, label)
    return ["sliding"] * n  # a model-wide window: vLLM applies it to every layer


def _shared_kv(text: Mapping[str, Any], model_type: str, kinds: list[str], label: str) -> list[str]:
    """Gemma 3n: the last `num_kv_shared_layers` layers read earlier layers' KV (vLLM's
    gemma3n.py), so vLLM allocates none for them."""
    if model_type not in ("gemma3n", "gemma3n_text"):
        return kinds
    shared = _int(text, "num_kv_shared_layers", label, 0)
    first = len(kinds) - shared
    if shared and first < 2:
        raise SizingError(f"{label}: num_kv_shared_layers {shared} leaves no layers to share")
    return [k if i < first else "none" for i, k in enumerate(kinds)]


def _family_kinds(
    text: Mapping[str, Any], arch: str, model_type: str, n: int, label: str
) -> list[str] | None:
    """Layer kinds of the hybrid families whose layout is their own (vLLM's model files):
    Jamba's attention by period and offset, Falcon-H1's attention and Mamba2 side by side in
    every layer (vLLM lists the attention layers first), Zamba2's shared attention blocks
    (one KV cache per hybrid layer, listed first) beside a Mamba2 mixer in every layer, LFM2's
    short convolutions. None for every other family."""
    if arch == "JambaForCausalLM" or model_type == "jamba":
        period = _int(text, "attn_layer_period", label, 8)
        offset = _int(text, "attn_layer_offset", label, 4)
        if not period:
            raise SizingError(f"{label}: attn_layer_period must be positive")
        return ["full" if i % period == offset else "mamba1" for i in range(n)]
    if arch == "FalconH1ForCausalLM" or model_type == "falcon_h1":
        return ["full"] * n + ["mamba2_h1"] * n
    if arch == "Zamba2ForCausalLM" or model_type == "zamba2":
        types = text.get("layers_block_type")
        if not isinstance(types, list):
            raise SizingError(f"{label}: config.json lacks layers_block_type (which are hybrid)")
        hybrid = sum(1 for t in _sized(types, n, "layers_block_type", label) if t == "hybrid")
        return ["zamba_attention"] * hybrid + ["mamba2_zamba"] * n
    if arch in ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM") or model_type in ("lfm2", "lfm2_moe"):
        types = text.get("layer_types")
        idxs = text.get("full_attn_idxs")
        if not isinstance(types, list) and model_type != "lfm2_moe":
            # transformers' Lfm2Config: attention at `full_attn_idxs`, every layer without it
            full = set(idxs) if isinstance(idxs, list) else set(range(n))
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        if not isinstance(types, list):
            raise SizingError(f"{label}: config.json lacks layer_types (which layers convolve)")
        return [
            "full" if t == "full_attention" else "short_conv"
            for t in _sized(types, n, "layer_types", label)
        ]
    return None


# transformers' default `sliding_window_pattern` where config.json gives neither it nor
# layer_types: every pattern-th layer is full (configuration_gemma2/gemma3/cohere2.py)
_DEFAULT_PATTERN = {
    "gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4, "exaone4": 4, "gemma3n_text": 5,
    "olmo3": 4,
}  # fmt: skip


def _transformers_layer_types(
    text: Mapping[str, Any], model_type: str, n: int, label: str, notes: list[str]
) -> list[str] | None:
    """The layer types transformers derives when config.json has none, which vLLM follows
    rather than a model-wide window. Qwen2 and Qwen3 (vLLM's Qwen2Model) slide only from
    `max_window_layers` on (28 by default), so with fewer layers than that nothing slides
    (`_refused_mix` says which mixes vLLM refuses); Gemma 2/3 and Cohere2 make every
    pattern-th layer full. Called with the window on (`use_sliding_window`); None where
    transformers' list is not what vLLM uses (Qwen2-MoE: vLLM slides every layer)."""
    if model_type in ("qwen2", "qwen3"):
        first = _max_window_layers(text, label)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    if model_type not in _DEFAULT_PATTERN:
        return None
    pattern = _opt_int(text, "sliding_window_pattern", label)
    if not pattern:
        pattern = _DEFAULT_PATTERN[model_type]
        notes.append(
            f"{label}: no layer_types or sliding_window_pattern; transformers' default "
            f"pattern of {pattern} applies (every {pattern}th layer full)"
        )
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _max_window_layers(text: Mapping[str, Any], label: str) -> int:
    first = _opt_int(text, "max_window_layers", label)
    return 28 if first is None else first  # transformers' default


def _refused_mix(text: Mapping[str, Any], model_type: str, types: list[Any], label: str) -> None:
    """vLLM's Qwen2Model refuses layer types that mix sliding and full attention unless
    `max_window_layers` equals the layer count."""
    if model_type not in ("qwen2", "qwen3") or len({str(t) for t in types}) < 2:
        return
    first = _max_window_layers(text, label)
    if first != len(types):
        raise SizingError(
            f"{label}: vLLM refuses to start it: sliding window on some but not all layers "
            f"(max_window_layers {first}, num_hidden_layers {len(types)}; vLLM's qwen2.py)"
        )


def _sized(values: list[Any], n: int, key: str, label: str) -> list[Any]:
    if len(values) < n:
        raise SizingError(f"{label}: {key} has {len(values)} entries for {n} layers")
    return values[:n]


def _hybrid_kind(t: Any, label: str) -> str:
    kinds = {
        "full_attention": "full",
        "attention": "full",
        "linear_attention": "gdn",
        "mamba": "mamba2",
    }
    if t not in kinds:
        raise SizingError(f"{label}: layer type {t!r} is not one kvwatch models")
    return kinds[t]


def _build_layer(
    kind: str, text: Mapping[str, Any], label: str, heads: int, hidden: int, arch: str = ""
) -> Layer:
    if kind == "none":
        return None
    if kind == "mla":
        rope = _int(text, "qk_rope_head_dim", label)
        nope = _int(text, "qk_nope_head_dim", label, 0)
        return MlaLayer(
            _int(text, "kv_lora_rank", label) + rope,
            nope + rope,
            _int(text, "v_head_dim", label, nope),
        )
    if kind == "gdn":
        kh, vh = (
            _int(text, "linear_num_key_heads", label),
            _int(text, "linear_num_value_heads", label),
        )
        kd, vd = (
            _int(text, "linear_key_head_dim", label),
            _int(text, "linear_value_head_dim", label),
        )
        conv = _int(text, "linear_conv_kernel_dim", label)
        return StateLayer("gdn", kd * kh * 2 + vd * vh, conv - 1, vh, vd, kd)
    if kind == "mamba1":  # Jamba's MambaMixer: (K-1, I) conv, (I, d_state) state
        inner = _int(text, "mamba_expand", label, 2) * hidden
        return StateLayer(
            "mamba1",
            conv_channels=inner,
            conv_len=_int(text, "mamba_d_conv", label, 4) - 1,
            ssm_heads=inner,
            ssm_a=1,
            ssm_b=_int(text, "mamba_d_state", label, 16),
        )
    if kind == "short_conv":  # LFM2's ShortConv: a (L_cache - 1, conv dim) state only
        dim = hidden if text.get("model_type") == "lfm2_moe" else _int(text, "conv_dim", label)
        return StateLayer(
            "short_conv",
            conv_channels=dim,
            conv_len=_int(text, "conv_L_cache", label, 3) - 1,
            ssm_heads=0,
            ssm_a=0,
            ssm_b=0,
        )
    if kind == "mamba2_h1":  # Falcon-H1's MambaMixer2
        inner = _opt_int(text, "mamba_d_ssm", label) or (
            _int(text, "mamba_expand", label, 2) * hidden
        )
        heads2 = _int(text, "mamba_n_heads", label)
        head_dim = (
            inner // max(heads2, 1)
            if text.get("mamba_d_head") in (None, "auto")
            else _int(text, "mamba_d_head", label)
        )
        return _mamba2(text, label, inner, heads2, head_dim, "mamba_n_groups",
                       "mamba_d_state", "mamba_d_conv")  # fmt: skip
    if kind == "mamba2_zamba":  # Zamba2's MambaMixer2
        inner = _int(text, "mamba_expand", label, 2) * hidden
        heads2 = _int(text, "n_mamba_heads", label)
        return _mamba2(text, label, inner, heads2, inner // max(heads2, 1), "mamba_ngroups",
                       "mamba_d_state", "mamba_d_conv")  # fmt: skip
    if kind == "zamba_attention":  # Zamba2's shared block: MHA, 2 x hidden / heads a head
        size = _int(text, "attention_head_dim", label, 2 * hidden // heads)
        return AttentionLayer("full", heads, size, size)
    if kind == "mamba2":
        # the mixer's intermediate size: expand x hidden (Granite 4), heads x head dim (NemotronH)
        if "mamba_expand" in text or "mamba_d_head" in text:
            channels = _int(text, "mamba_expand", label, 2) * hidden
        else:
            channels = _int(text, "mamba_num_heads", label) * _int(text, "mamba_head_dim", label)
        return StateLayer(
            "mamba2",
            conv_channels=channels,
            conv_len=_int(text, "mamba_d_conv", label, _int(text, "conv_kernel", label, 4)) - 1,
            ssm_heads=_int(text, "mamba_n_heads", label, text.get("mamba_num_heads")),
            ssm_a=_int(text, "mamba_d_head", label, text.get("mamba_head_dim")),
            ssm_b=_int(text, "mamba_d_state", label, text.get("ssm_state_size")),
            mamba_groups=_int(text, "mamba_n_groups", label, text.get("n_groups")),
            mamba_state=_int(text, "mamba_d_state", label, text.get("ssm_state_size")),
            checkpoint_blocks=1,
        )
    head = text.get("head_dim")
    if not isinstance(head, int) or head <= 0 or arch in _HEAD_FROM_HIDDEN:
        head = hidden // heads
    if head <= 0:
        raise SizingError(f"{label}: hidden_size {hidden} over {heads} heads leaves no head")
    kv = text.get("num_key_value_heads")
    if kv is None:
        kv = text.get("num_kv_heads", heads)
    pinned = 0
    if arch == "FalconForCausalLM":
        # vLLM's falcon.py: the new decoder's num_kv_heads, else one head for multi-query,
        # else one per query head; its attention is built without the cache config, so its
        # KV keeps the model's dtype whatever --kv-cache-dtype says
        if text.get("new_decoder_architecture"):
            kv = _int(text, "num_kv_heads", label, heads)
        else:
            kv = 1 if text.get("multi_query", True) else heads
        pinned = _DTYPE_BYTES.get(str(text.get("torch_dtype") or "bfloat16"), 2)
    if isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0:
        raise SizingError(f"{label}: num_key_value_heads must be a positive integer, not {kv!r}")
    window = None
    if kind == "sliding":
        window = _int(text, "sliding_window", label)
        if text.get("model_type") == "cohere2" and window:
            window += 1  # vLLM's commandr.py: a Cohere2 layer sees [pos - W, pos], W + 1 tokens
    elif kind == "chunked":
        window = _int(text, "attention_chunk_size", label)
    return AttentionLayer(kind, kv, head, head, window, pinned)  # type: ignore[arg-type]


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _mamba2(
    text: Mapping[str, Any], label: str, inner: int, heads: int, head_dim: int,
    groups_key: str, state_key: str, conv_key: str,
) -> StateLayer:  # fmt: skip
    state = _int(text, state_key, label)
    return StateLayer(
        "mamba2",
        conv_channels=inner,
        conv_len=_int(text, conv_key, label, 4) - 1,
        ssm_heads=heads,
        ssm_a=head_dim,
        ssm_b=state,
        mamba_groups=_int(text, groups_key, label, 1),
        mamba_state=state,
        checkpoint_blocks=1,
    )


def _size(v: Any, default: int = 0) -> int:
    """A count from config.json for the parameter estimate: a per-layer list counts as its
    largest entry (Gemma 3n's intermediate_size), anything not a count as `default`."""
    if isinstance(v, list):
        v = max((x for x in v if isinstance(x, int) and not isinstance(x, bool)), default=None)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v < 0:
        return default
    return int(min(v, 1 << 40))


def _experts(text: Mapping[str, Any]) -> tuple[int, int]:
    """(routed experts, experts per token); (0, 0) for a dense model."""
    experts = _size(
        text.get("num_local_experts") or text.get("n_routed_experts") or text.get("num_experts")
    )
    return experts, _size(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0)


def _mlp_width(text: Mapping[str, Any]) -> int:
    dense = _size(text.get("intermediate_size_mlp") or text.get("intermediate_size") or 0)
    experts, per_tok = _experts(text)
    routed = per_tok * _size(text.get("moe_intermediate_size") or 0) if experts else 0
    return max(dense, routed)


def _routed_share(text: Mapping[str, Any]) -> float:
    experts, per_tok = _experts(text)
    return min(1.0, per_tok / experts) if experts and per_tok else 0.0


def _params(
    text: Mapping[str, Any], layers: tuple[Layer, ...], label: str
) -> tuple[ParamCounts, float]:
    """All parameters by where they sit, and the active ones, from the shapes (SwiGLU MLPs,
    untied unless said)."""
    hidden = _size(text.get("hidden_size"))
    heads = _size(text.get("num_attention_heads"), 1)
    vocab = _size(text.get("vocab_size") or 32000)
    inter = _size(text.get("intermediate_size") or 4 * hidden)
    experts, per_tok = _experts(text)
    moe_inter = _size(text.get("moe_intermediate_size") or inter)
    shared = _size(text.get("n_shared_experts")) * moe_inter + _size(
        text.get("shared_expert_intermediate_size")
    )
    total = active = 0.0
    attns: list[float] = []
    mlps: list[float] = []
    for layer, moe in zip(layers, _moe_layer_flags(text, len(layers)), strict=True):
        attn = _attention_params(layer, text, hidden, heads)
        if moe:
            mlp_total = 3 * hidden * (experts * moe_inter + shared) + hidden * experts
            mlp_active = 3 * hidden * (per_tok * moe_inter + shared) + hidden * experts
        else:
            dense_inter = _size(text.get("intermediate_size_mlp") or inter)
            mlp_total = mlp_active = 3 * hidden * dense_inter
        total += attn + mlp_total
        active += attn + mlp_active
        attns.append(attn)
        mlps.append(mlp_total)
    head = 0 if text.get("tie_word_embeddings") else vocab * hidden
    counts = ParamCounts(
        total=total + vocab * hidden + head,
        embeddings=vocab * hidden,
        lm_head=head,
        attention=attns,
        mlp=mlps,
        heads=heads,
        kv_heads=[x.kv_heads if isinstance(x, AttentionLayer) else 0 for x in layers],
    )
    return counts, active + vocab * hidden + head


def _moe_layer_flags(text: Mapping[str, Any], n_layers: int) -> list[bool]:
    """Which layers route to experts: after `first_k_dense_replace` dense ones, every
    `interleave_moe_layer_step`-th (Llama 4); none in a dense model."""
    experts, _ = _experts(text)
    period = text.get("expert_layer_period")
    if isinstance(period, int) and period > 0:  # Jamba: every period-th layer from the offset
        offset = _size(text.get("expert_layer_offset") or 0)
        return [experts > 0 and i % period == offset for i in range(n_layers)]
    dense_first = _size(text.get("first_k_dense_replace") or 0)
    step = _size(text.get("interleave_moe_layer_step"), 1) or 1
    return [experts > 0 and i >= dense_first and (i + 1) % step == 0 for i in range(n_layers)]


def _attention_params(layer: Layer, text: Mapping[str, Any], hidden: int, heads: int) -> float:
    if isinstance(layer, AttentionLayer):
        return hidden * layer.head_size * (2 * heads + 2 * layer.kv_heads)
    if isinstance(layer, MlaLayer):
        rope = _size(text.get("qk_rope_head_dim") or 0)
        nope = _size(text.get("qk_nope_head_dim") or 0)
        v = _size(text.get("v_head_dim") or nope)
        lora = _size(text.get("kv_lora_rank") or 0)
        q_lora = _size(text.get("q_lora_rank") or 0)  # a negative rank is no rank (fuzzing)
        q = (
            hidden * q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        return q + hidden * (lora + rope) + lora * heads * (nope + v) + heads * v * hidden
    if isinstance(layer, StateLayer):
        conv, ssm = layer.shapes(1)
        return 2 * hidden * (conv // max(layer.conv_len, 1)) + ssm // max(layer.ssm_b, 1) * 2
    return 0.0
