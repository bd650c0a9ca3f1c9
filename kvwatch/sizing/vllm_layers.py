"""A model's KV layers as vLLM's own model classes declare them, where vLLM is installed.

`vllm_specs.py` builds the model in a child process on the meta device and lists each
attention layer's KV spec; this module turns those specs into kvwatch's `Layer`s, so the
arithmetic that makes blocks (`kvplan.py`) works from vLLM's layers rather than from kvwatch's
reading of config.json. Any architecture vLLM serves is then sized as vLLM sizes it: hybrids,
KV shared across layers, new families. A spec kvwatch cannot turn into blocks exactly (a kind
it does not know, or a field it would ignore) is refused, never approximated.

The answer is cached per config and vLLM build (`$KVWATCH_CACHE/vllm-layers`): the first
sizing of a config costs vLLM's import and one meta build (about 10 s here), later ones a read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.sizing.archconfig import (
    AttentionLayer,
    BuiltModel,
    Layer,
    MlaLayer,
    StateLayer,
    refuse_attention_free,
)
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.vllm_specs import MARK

__all__ = [
    "VllmLayers",
    "vllm_installed",
    "read_vllm_layers",
    "layers_from_specs",
    "layers_from_answer",
    "run_spec_builder",
    "offline_vllm_env",
    "source_name",
    "signature",
]

_CACHE_VERSION = 2  # the builder's answer format: bump when vllm_specs.py changes it
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


def vllm_installed() -> Path | None:
    """vLLM's package folder when this interpreter can import it (without importing it)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent


def _cache_dir() -> Path:
    root = os.environ.get("KVWATCH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "kvwatch") / "vllm-layers"


def _build_key(folder: Path) -> str:
    """The installed vLLM build: its folder and the time its files were installed."""
    marker = folder / "__init__.py"
    try:
        stamp = max(marker.stat().st_mtime_ns, (folder / "_version.py").stat().st_mtime_ns)
    except OSError:
        stamp = marker.stat().st_mtime_ns if marker.exists() else 0
    return f"{folder}:{stamp}"


def _key(config: Mapping[str, Any], build: str) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(f"{_CACHE_VERSION}\n{build}\n{text}".encode()).hexdigest()[:32]


def read_vllm_layers(config: Mapping[str, Any], label: str, timeout_s: float = 300.0) -> VllmLayers:
    """vLLM's layers for `config`, from the cache or a child process; a SizingError in one
    line where vLLM is not installed, cannot build the model here, or gives a spec kvwatch
    cannot size exactly."""
    folder = vllm_installed()
    if folder is None:
        raise SizingError("vLLM is not installed in this Python (pip install 'kvwatch[gpu]')")
    key = _key(config, _build_key(folder))
    cached = _cache_dir() / f"{key}.json"
    found: dict[str, Any] | None = None
    try:
        found = json.loads(cached.read_text())
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict):
        found = _run_child(config, timeout_s)
        if "error" not in found:
            _store(cached, found)
    return layers_from_answer(found, label)


def _store(path: Path, found: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written costs the next run a rebuild, nothing else


def _run_child(config: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    if sys.stderr.isatty():  # the first sizing of a config takes seconds: say why
        print("kvwatch: building the model with vLLM's own classes (once per config) ...",
              file=sys.stderr, flush=True)  # fmt: skip
    return run_spec_builder({"model": dict(config)}, timeout_s)["model"]


def offline_vllm_env(log_level: str | None = None) -> dict[str, str]:
    """The environment of a child that runs vLLM in-process and offline (the spec builder,
    the tests' oracle and twin probe): one process, no hub, no usage stats, vLLM's own
    platform rather than the twin's unless the child asks for it itself."""
    env = dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    if log_level:
        env["VLLM_LOGGING_LEVEL"] = log_level
    env.pop("KVWATCH_TWIN", None)
    return env


def run_spec_builder(
    configs: Mapping[str, Mapping[str, Any]], timeout_s: float = 300.0
) -> dict[str, dict[str, Any]]:
    """Each config's answer from one child running `vllm_specs.py` (vLLM imported once for
    all of them): its layers and model, or `{"error": ...}` in one line. Never raises."""
    env = offline_vllm_env(log_level="ERROR")
    cases = json.dumps([{"id": k, "config": v} for k, v in configs.items()], default=str)
    why = None
    found: dict[str, dict[str, Any]] = {}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvwatch.sizing.vllm_specs"],
            input=cases,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        why = f"vLLM did not build the model within {timeout_s:.0f} s"
    except OSError as e:
        why = f"cannot start {sys.executable}: {e.strerror}"
    else:
        for line in proc.stdout.splitlines():
            if not line.startswith(MARK):
                continue
            try:
                item = json.loads(line[len(MARK) :])
            except ValueError:
                continue
            if isinstance(item, dict) and str(item.get("id")) in configs:
                found[str(item.pop("id"))] = item
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"vLLM's model builder exited {proc.returncode}: {tail[:120]}"
    return {k: found.get(k) or {"error": why} for k in configs}


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
