"""A model's KV layers as vLLM's own model classes declare them, where vLLM is installed.

`kvwatch/local/vllm_specs.py` builds the model in a child process on the meta device and
lists each attention layer's KV spec (run and cached by `kvwatch/local/vllm_builder.py`, the
process half); this module turns those specs into kvwatch's `Layer`s (pure), so the arithmetic
that makes blocks (`kvplan.py`) works from vLLM's layers rather than from kvwatch's reading of
config.json. Any architecture vLLM serves is then sized as vLLM sizes it: hybrids,
KV shared across layers, new families. A spec kvwatch cannot turn into blocks exactly (a kind
it does not know, or a field it would ignore) is refused, never approximated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.local.vllm_builder import vllm_answer
from kvwatch.sizing.archconfig import (
    AttentionLayer,
    BuiltModel,
    Layer,
    MlaLayer,
    StateLayer,
    refuse_attention_free,
)
from kvwatch.sizing.errors import SizingError

__all__ = [
    "VllmLayers",
    "read_vllm_layers",
    "layers_from_specs",
    "layers_from_answer",
    "source_name",
    "signature",
]

# spec fields kvwatch's block arithmetic reads, and the values of the rest it assumes: a spec
# whose other fields differ would be sized wrong, so it is refused
_ATTENTION_ASSUMED: dict[str, Any] = {
    "page_size_padded": None,
    "num_head_slots": None,
    "state_content_bytes": None,
    "tokens_per_state": 1,
    "non_causal": False,
    "extra_retained_tokens": 0,
    "alignment": None,
}
_STATE_ASSUMED: dict[str, Any] = {
    "page_size_padded": None,
    "num_speculative_blocks": 0,
    "tp_replicated": False,
}
# MambaSpec's state tensors, in order: which hold the convolution (model dtype) and which the
# recurrent state (the SSM state dtype), per mixer type
_STATE_ROLES = {
    "MAMBA1": ("conv", "ssm"),
    "MAMBA2": ("conv", "ssm"),
    "GDN_ATTN": ("conv", "ssm"),
    "SHORT_CONV": ("conv",),
    "LINEAR": ("ssm",),
}


@dataclass(frozen=True)
class VllmLayers:
    """What vLLM's model classes said of one config: its layers in vLLM's order (a layer
    that reads another's KV is left out: vLLM allocates nothing for it) and the model's
    own facts (`vllm_specs.py`)."""

    version: str
    layers: tuple[Layer, ...]
    shared: int  # layers that read another layer's KV
    decoder_layers: int
    hidden_size: int
    attention_heads: int
    params: int
    model_class: str
    changes: tuple[str, ...]

    @property
    def source(self) -> str:
        return source_name(self.version)

    def as_built(self) -> BuiltModel:
        return BuiltModel(
            self.layers, self.hidden_size, self.attention_heads, self.params, self.source
        )


def source_name(version: str | None) -> str:
    """What sized the layers, as `--json` and the text say it."""
    return f"vllm {version} model classes" if version else "kvwatch arithmetic"


def read_vllm_layers(config: Mapping[str, Any], label: str, timeout_s: float = 300.0) -> VllmLayers:
    """vLLM's layers for `config`, from the cache or a child process (kvwatch/local/
    vllm_builder.py); a SizingError in one line where vLLM is not installed, cannot build the
    model here, or gives a spec kvwatch cannot size exactly."""
    found = vllm_answer(config, timeout_s)
    if found is None:
        raise SizingError("vLLM is not installed in this Python (pip install 'kvwatch[gpu]')")
    return layers_from_answer(found, label)


def layers_from_answer(found: Any, label: str) -> VllmLayers:
    """The child's answer (or a cached one, which may have been edited) as `VllmLayers`, or a
    one-line SizingError."""
    if not isinstance(found, dict):
        raise SizingError(
            f"{label}: vLLM's model builder gave {type(found).__name__}, not an answer"
        )
    if "error" in found:
        why = " ".join(str(found["error"]).split())
        raise SizingError(f"{label}: vLLM could not build its layers here ({why})"[:300])
    model = found.get("model")
    items = found.get("layers")
    if not isinstance(model, dict) or not isinstance(items, list):
        raise SizingError(f"{label}: vLLM's model builder gave an answer without layers")
    dtype = str(model.get("dtype") or "")
    probes = model.get("probes")
    layers, shared = layers_from_specs(
        items, label, dtype, probes if isinstance(probes, dict) else {}
    )
    changes = model.get("changes")
    return VllmLayers(
        version=" ".join(str(found.get("vllm") or "?").split())[:40],
        layers=layers,
        shared=shared,
        decoder_layers=_count(model, "num_layers", label),
        hidden_size=_count(model, "hidden_size", label),
        attention_heads=_count(model, "num_attention_heads", label),
        params=_count(model, "params", label),
        model_class=" ".join(str(model.get("architecture") or "").split())[:80],
        changes=tuple(str(c)[:120] for c in changes) if isinstance(changes, list) else (),
    )


def _count(model: Mapping[str, Any], key: str, label: str) -> int:
    v = model.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SizingError(f"{label}: vLLM's built model gives {key}={str(v)[:40]!r}")
    return v


def layers_from_specs(
    items: list[Any], label: str, model_dtype: str = "", probes: Mapping[str, Any] | None = None
) -> tuple[tuple[Layer, ...], int]:
    """vLLM's layer specs (as `vllm_specs.py` lists them) as kvwatch layers, in layer order,
    and how many layers read another layer's KV. Refuses what it cannot size exactly.

    `probes`: the KV and state dtypes the builder set on the cache config (`vllm_specs.py`):
    a tensor in the probe's dtype follows the serving flag, one in `model_dtype` the model's
    dtype, any other is pinned by the model file. Without probes, vLLM's usual roles."""
    roles = _Roles(model_dtype, dict(probes or {}))
    keyed: list[tuple[int, str, Layer]] = []
    shared = 0
    for item in items:
        if not isinstance(item, dict):
            raise SizingError(f"{label}: vLLM's layer list holds {type(item).__name__}")
        index = item.get("index")
        name = " ".join(str(item.get("name", "?")).split())[:120]
        if not isinstance(index, int):
            raise SizingError(f"{label}: vLLM's layer {name} has no layer index")
        if item.get("shares"):
            shared += 1
            continue
        spec = item.get("spec")
        if spec is None:
            continue  # a layer vLLM gives no KV cache
        if not isinstance(spec, dict):
            raise SizingError(f"{label}: vLLM's spec for {name[:80]} is not a mapping")
        keyed.append((index, name, _layer(spec, name, label, roles)))
    keyed.sort(key=lambda t: (t[0], t[1]))
    if not keyed:
        raise SizingError(f"{label}: vLLM's model classes give it no KV cache layers")
    layers = tuple(layer for _, _, layer in keyed)
    refuse_attention_free(layers, label)
    return layers, shared


def _odd(spec: Mapping[str, Any], assumed: Mapping[str, Any]) -> list[str]:
    odd = [k for k, v in assumed.items() if k in spec and spec[k] != v]
    # an fp8 cache (the builder's probe) is per-tensor fp8 (1); any other quantization is not
    # the bytes kvwatch counts
    quant = spec.get("kv_quant_mode", 0)
    if quant not in (0, 1) or (quant == 1 and str(spec.get("dtype")) not in _FP8_NAMES):
        odd.append("kv_quant_mode")
    return odd


def _positive(spec: Mapping[str, Any], key: str, name: str, label: str) -> int:
    v = spec.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SizingError(f"{label}: vLLM's spec for {name} has {key}={v!r}")
    return v


@dataclass(frozen=True)
class _Roles:
    model_dtype: str
    probes: dict[str, Any]

    def attention_pinned(self, spec: Mapping[str, Any], name: str, label: str) -> int:
        """0 where the layer's KV follows --kv-cache-dtype, else its pinned bytes."""
        if not self.probes.get("kv"):
            return 0
        dtype = str(spec.get("dtype"))
        if dtype in _FP8_NAMES:
            return 0
        if dtype == self.model_dtype and dtype in _DTYPE_BYTES:
            return _DTYPE_BYTES[dtype]
        raise SizingError(f"{label}: {name} keeps its KV as {dtype[:20]}: kvwatch does not size it")


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_FP8_NAMES = {"uint8", "float8_e4m3fn", "float8_e5m2"}


def _layer(spec: Mapping[str, Any], name: str, label: str, roles: _Roles) -> Layer:
    kind = str(spec.get("type"))
    if kind in ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec"):
        odd = _odd(spec, _ATTENTION_ASSUMED)
        if odd:
            raise SizingError(f"{label}: {name} is a {kind} with {', '.join(odd)} set, "
                              "which kvwatch's arithmetic does not size")  # fmt: skip
        heads = _positive(spec, "num_kv_heads", name, label)
        k = _positive(spec, "head_size", name, label)
        pinned = roles.attention_pinned(spec, name, label)
        v = spec.get("head_size_v") or k
        window = spec.get("sliding_window")
        chunk = spec.get("attention_chunk_size")
        if kind == "ChunkedLocalAttentionSpec" or (kind == "FullAttentionSpec" and chunk):
            size = _positive(spec, "attention_chunk_size", name, label)
            return AttentionLayer("chunked", heads, k, v, size, pinned)
        if kind == "SlidingWindowSpec" or window:
            size = _positive(spec, "sliding_window", name, label)
            return AttentionLayer("sliding", heads, k, v, size, pinned)
        return AttentionLayer("full", heads, k, v, None, pinned)
    if kind == "MLAAttentionSpec":
        odd = _odd(spec, _ATTENTION_ASSUMED)
        if (
            odd
            or spec.get("num_kv_heads") != 1
            or spec.get("model_version")
            or roles.attention_pinned(spec, name, label)
        ):
            raise SizingError(f"{label}: {name} is an MLA spec kvwatch does not size "
                              f"({', '.join(odd) or 'heads or version'})")  # fmt: skip
        return MlaLayer(_positive(spec, "head_size", name, label))
    if kind == "MambaSpec":
        return _state(spec, name, label, roles)
    raise SizingError(f"{label}: vLLM sizes {name} as {kind}, which kvwatch does not size")


def _state(spec: Mapping[str, Any], name: str, label: str, roles: _Roles) -> StateLayer:
    mixer = str(spec.get("mamba_type"))
    shapes = spec.get("shapes")
    dtypes = spec.get("dtypes")
    odd = _odd(spec, _STATE_ASSUMED)
    order = _STATE_ROLES.get(mixer)
    if (
        order is None
        or odd
        or not isinstance(shapes, list)
        or not isinstance(dtypes, list)
        or len(shapes) != len(dtypes)
    ):
        raise SizingError(f"{label}: {name} is a {mixer[:20]} state kvwatch does not size")
    if not all(isinstance(d, str) for d in dtypes):  # a cache file edited by anyone
        raise SizingError(f"{label}: {name}'s state dtypes {str(dtypes)[:40]} are not names")
    sizes = {"conv": 0, "ssm": 0}
    fixed = 0
    probe = roles.probes.get("state")
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
        if not (isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape)):
            raise SizingError(f"{label}: {name}'s state shape {str(shape)[:40]} is not sizes")
        n = 1
        for d in shape:
            n *= d
        if not probe:
            if len(shapes) != len(order):
                raise SizingError(f"{label}: {name} has {len(shapes)} state tensors")
            sizes[order[i]] += n
        elif dtype == probe:
            sizes["ssm"] += n
        elif dtype == roles.model_dtype:
            sizes["conv"] += n
        elif dtype in _DTYPE_BYTES:
            fixed += n * _DTYPE_BYTES[dtype]
        else:
            raise SizingError(f"{label}: {name} keeps a state as {str(dtype)[:20]}")
    checkpoint = spec.get("num_prefill_checkpoint_blocks") or 0
    if not isinstance(checkpoint, int) or checkpoint < 0:
        raise SizingError(f"{label}: {name} has {str(checkpoint)[:20]} checkpoint blocks")
    return StateLayer(
        "vllm",
        conv_channels=sizes["conv"],
        conv_len=1,
        ssm_heads=1,
        ssm_a=1,
        ssm_b=sizes["ssm"],
        checkpoint_blocks=checkpoint,
        mixer=mixer.lower(),
        fixed_bytes=fixed,
    )


def signature(layers: tuple[Layer, ...]) -> list[tuple[Any, ...]]:
    """What of each KV layer decides its blocks, comparable across the two readings (vLLM's
    specs, kvwatch's arithmetic): layers without KV left out, states as element counts."""
    out: list[tuple[Any, ...]] = []
    for x in layers:
        if isinstance(x, AttentionLayer):
            out.append(
                ("attention", x.kind, x.kv_heads, x.head_size, x.head_size_v, x.window,
                 x.pinned_bytes)
            )  # fmt: skip
        elif isinstance(x, MlaLayer):
            out.append(("mla", x.latent))
        elif isinstance(x, StateLayer):
            out.append(("state", *x.shapes(1), x.fixed_bytes, x.checkpoint_blocks))
    return out
