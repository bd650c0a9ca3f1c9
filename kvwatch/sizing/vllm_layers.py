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

from kvwatch.sizing.archconfig import AttentionLayer, BuiltModel, Layer, MlaLayer, StateLayer
from kvwatch.sizing.errors import SizingError

__all__ = [
    "VllmLayers",
    "vllm_installed",
    "read_vllm_layers",
    "layers_from_specs",
    "source_name",
]

_MARK = "KVWATCH-SPECS "
_CACHE_VERSION = 1
# spec fields kvwatch's block arithmetic reads, and the values of the rest it assumes: a spec
# whose other fields differ would be sized wrong, so it is refused
_ATTENTION_ASSUMED: dict[str, Any] = {
    "kv_quant_mode": 0,
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
    return _from_answer(found, label)


def _store(path: Path, found: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written costs the next run a rebuild, nothing else


def _run_child(config: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    env = dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="ERROR",
    )
    env.pop("KVWATCH_TWIN", None)  # vLLM's own platform, not the twin's
    cases = json.dumps([{"id": "model", "config": config}], default=str)
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
        return {"error": f"vLLM did not build the model within {timeout_s:.0f} s"}
    except OSError as e:
        return {"error": f"cannot start {sys.executable}: {e.strerror}"}
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                item = json.loads(line[len(_MARK) :])
            except ValueError:
                break
            if isinstance(item, dict):
                return item
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"vLLM's model builder exited {proc.returncode}: {tail[:120]}"}


def _from_answer(found: Mapping[str, Any], label: str) -> VllmLayers:
    if "error" in found:
        raise SizingError(f"{label}: vLLM could not build its layers here ({found['error']})"[:300])
    model = found.get("model")
    items = found.get("layers")
    if not isinstance(model, dict) or not isinstance(items, list):
        raise SizingError(f"{label}: vLLM's model builder gave an answer without layers")
    layers, shared = layers_from_specs(items, label)
    return VllmLayers(
        version=str(found.get("vllm") or "?"),
        layers=layers,
        shared=shared,
        decoder_layers=int(model.get("num_layers") or 0),
        hidden_size=int(model.get("hidden_size") or 0),
        attention_heads=int(model.get("num_attention_heads") or 0),
        params=int(model.get("params") or 0),
        model_class=str(model.get("architecture") or ""),
        changes=tuple(str(c) for c in model.get("changes") or ()),
    )


def layers_from_specs(items: list[Any], label: str) -> tuple[tuple[Layer, ...], int]:
    """vLLM's layer specs (as `vllm_specs.py` lists them) as kvwatch layers, in layer order,
    and how many layers read another layer's KV. Refuses what it cannot size exactly."""
    keyed: list[tuple[int, str, Layer]] = []
    shared = 0
    for item in items:
        if not isinstance(item, dict):
            raise SizingError(f"{label}: vLLM's layer list holds {type(item).__name__}")
        index = item.get("index")
        name = str(item.get("name", "?"))
        if not isinstance(index, int):
            raise SizingError(f"{label}: vLLM's layer {name} has no layer index")
        if item.get("shares"):
            shared += 1
            continue
        spec = item.get("spec")
        if spec is None:
            continue  # a layer vLLM gives no KV cache
        keyed.append((index, name, _layer(spec, name, label)))
    keyed.sort(key=lambda t: (t[0], t[1]))
    if not keyed:
        raise SizingError(f"{label}: vLLM's model classes give it no KV cache layers")
    return tuple(layer for _, _, layer in keyed), shared


def _odd(spec: Mapping[str, Any], assumed: Mapping[str, Any]) -> list[str]:
    return [k for k, v in assumed.items() if k in spec and spec[k] != v]


def _positive(spec: Mapping[str, Any], key: str, name: str, label: str) -> int:
    v = spec.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SizingError(f"{label}: vLLM's spec for {name} has {key}={v!r}")
    return v


def _layer(spec: Mapping[str, Any], name: str, label: str) -> Layer:
    kind = str(spec.get("type"))
    if kind in ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec"):
        odd = _odd(spec, _ATTENTION_ASSUMED)
        if odd:
            raise SizingError(f"{label}: {name} is a {kind} with {', '.join(odd)} set, "
                              "which kvwatch's arithmetic does not size")  # fmt: skip
        heads = _positive(spec, "num_kv_heads", name, label)
        k = _positive(spec, "head_size", name, label)
        v = spec.get("head_size_v") or k
        window = spec.get("sliding_window")
        chunk = spec.get("attention_chunk_size")
        if kind == "ChunkedLocalAttentionSpec" or (kind == "FullAttentionSpec" and chunk):
            return AttentionLayer("chunked", heads, k, v, _positive(spec, "attention_chunk_size",
                                                                   name, label))  # fmt: skip
        if kind == "SlidingWindowSpec" or window:
            return AttentionLayer("sliding", heads, k, v, _positive(spec, "sliding_window",
                                                                   name, label))  # fmt: skip
        return AttentionLayer("full", heads, k, v)
    if kind == "MLAAttentionSpec":
        odd = _odd(spec, _ATTENTION_ASSUMED)
        if odd or spec.get("num_kv_heads") != 1 or spec.get("model_version"):
            raise SizingError(f"{label}: {name} is an MLA spec kvwatch does not size "
                              f"({', '.join(odd) or 'heads or version'})")  # fmt: skip
        return MlaLayer(_positive(spec, "head_size", name, label))
    if kind == "MambaSpec":
        return _state(spec, name, label)
    raise SizingError(f"{label}: vLLM sizes {name} as {kind}, which kvwatch does not size")


def _state(spec: Mapping[str, Any], name: str, label: str) -> StateLayer:
    mixer = str(spec.get("mamba_type"))
    roles = _STATE_ROLES.get(mixer)
    shapes = spec.get("shapes")
    odd = _odd(spec, _STATE_ASSUMED)
    if roles is None or odd or not isinstance(shapes, list) or len(shapes) != len(roles):
        raise SizingError(f"{label}: {name} is a {mixer} state kvwatch does not size")
    sizes: dict[str, int] = {"conv": 0, "ssm": 0}
    for role, shape in zip(roles, shapes, strict=True):
        if not (isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape)):
            raise SizingError(f"{label}: {name}'s state shape {shape!r} is not sizes")
        n = 1
        for d in shape:
            n *= d
        sizes[role] += n
    checkpoint = spec.get("num_prefill_checkpoint_blocks") or 0
    if not isinstance(checkpoint, int) or checkpoint < 0:
        raise SizingError(f"{label}: {name} has {checkpoint!r} checkpoint blocks")
    return StateLayer(
        "vllm",
        conv_channels=sizes["conv"],
        conv_len=1,
        ssm_heads=1,
        ssm_a=1,
        ssm_b=sizes["ssm"],
        checkpoint_blocks=checkpoint,
        mixer=mixer.lower(),
    )
