"""Every text-generation architecture in vLLM's registry, sized both ways and compared.

For each text architecture vLLM registers (`_TEXT_GENERATION_MODELS` and the text part of
`_TRANSFORMERS_SUPPORTED_MODELS`, the release in `.venv`), a
tiny config from transformers' config class defaults (at most 8 layers; vLLM's own config
classes where it has one): vLLM's model classes build it on the meta device and list each
layer's KV spec (`kvwatch/local/vllm_specs.py`, no engine start), and kvwatch's arithmetic
reads the same config. Each architecture lands in one class (`classify`):

- equal: the arithmetic's layers equal vLLM's (kind, heads, head sizes, window; state sizes);
- refused: the arithmetic refuses it in one line (vLLM's specs size it where vLLM is installed);
- WRONG: the arithmetic gives layers that differ from vLLM's: a wrong figure;
- vLLM cannot build it here: from transformers' defaults on this CPU build (sparse attention,
  kernels only CUDA has, defaults that lack a field the model needs); the arithmetic, if it
  accepts the config, is unchecked here;
- no config class: the architecture needs remote code, which a sweep does not run.

The vLLM path's own verdict is recorded beside it: sized, or refused (a spec kvwatch cannot
turn into blocks exactly). Used by bench/bench_arch_sweep.py and tests/sizing/test_arch_sweep.py.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MAX_LAYERS = 8
CLASSES = ("equal", "refused", "WRONG", "vLLM cannot build it here", "no config class")


def registry_architectures() -> list[str]:
    """vLLM's text-generation architectures, read from its registry's source (no import):
    its own model files, then those it serves through the Transformers backend."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vLLM is not installed"
    text = (Path(spec.origin).parent / "model_executor" / "models" / "registry.py").read_text()
    start = text.index("_TEXT_GENERATION_MODELS = {")
    body = text[start : text.index("\n}\n", start)]
    own = re.findall(r'^\s+"(\w+)": \(', body, flags=re.M)
    # and the text models vLLM serves through its Transformers backend
    start = text.index("_TRANSFORMERS_SUPPORTED_MODELS = {")
    body = text[start : text.index("# Multimodal models", start)]
    return own + [a for a in re.findall(r'^\s+"(\w+)": \(', body, flags=re.M) if a not in own]


# Fields a published checkpoint's config.json carries and transformers' defaults leave out,
# so vLLM's model class (which reads the checkpoint's own names) can be built. Each is the
# value the named checkpoint has, or derived from the defaults the same way.
def _fix(arch: str, d: dict[str, Any]) -> None:
    h, heads = d.get("hidden_size"), d.get("num_attention_heads")
    if arch == "Glm4MoeForCausalLM":  # zai-org/GLM-4.5: head_dim 128 = hidden / heads there
        d.setdefault("head_dim", h // heads)
    elif arch == "MiniMaxM2ForCausalLM":  # MiniMaxAI/MiniMax-M2: rotary_dim 64 of head_dim 128
        d.setdefault("rotary_dim", (d.get("head_dim") or h // heads) // 2)
        d.setdefault("scoring_func", "sigmoid")
    elif arch in ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM"):  # LiquidAI/LFM2: block_* names
        d.setdefault("block_dim", h)
        d.setdefault("block_ff_dim", d.get("intermediate_size"))
        d.setdefault("conv_dim", h)
        # LFM2-1.2B's pattern (full attention at 2, 5, 8, ...): defaults make every layer full
        n = d.get("num_hidden_layers") or MAX_LAYERS
        d["full_attn_idxs"] = [i for i in range(n) if i % 3 == 2]
        d["layer_types"] = ["full_attention" if i % 3 == 2 else "conv" for i in range(n)]
    elif arch == "NemotronForCausalLM" and d.get("num_key_value_heads") is None:
        d["num_key_value_heads"] = heads  # nvidia/Nemotron-4 gives its KV heads


# Constructor arguments where a config class's defaults cannot shrink to MAX_LAYERS, or would
# not show what the family does (KV sharing needs shared layers)
_KWARGS: dict[str, dict[str, Any]] = {
    "Zamba2ForCausalLM": {
        "layers_block_type": [
            "mamba",
            "mamba",
            "hybrid",
            "mamba",
            "mamba",
            "hybrid",
            "mamba",
            "mamba",
        ],
        "num_hidden_layers": MAX_LAYERS,
    },  # fmt: skip
    "Gemma3nForCausalLM": {"num_kv_shared_layers": 3},
    # Granite 4.0-H's pattern (its defaults are Mamba only: attention-free, refused both ways)
    "GraniteMoeHybridForCausalLM": {
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "num_hidden_layers": MAX_LAYERS,
    },
    "Gemma4ForCausalLM": {"num_kv_shared_layers": 2},
}


def tiny_configs(archs: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """arch -> a config from its config class's defaults; arch -> why there is none."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type: dict[str, str] = {}
    for mt, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        for name in cls if isinstance(cls, tuple | list) else [cls]:
            # a causal LM's own config over its multimodal parent's (llama4_text, not llama4)
            if name not in model_type or mt.endswith("_text"):
                model_type[name] = mt
    configs: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for arch in archs:
        mt = model_type.get(arch)
        if mt is None or mt not in CONFIG_MAPPING:
            missing[arch] = "no config class in transformers (remote code)"
            continue
        cls = CONFIG_MAPPING[mt]
        try:
            kwargs = _KWARGS.get(arch, {})
            if "num_hidden_layers" in kwargs:
                cfg = cls(**kwargs)
            else:
                n = getattr(cls(**kwargs), "num_hidden_layers", None)
                cfg = cls(num_hidden_layers=min(n, MAX_LAYERS), **kwargs) if isinstance(n, int) \
                    else cls(**kwargs)  # fmt: skip
        except Exception as e:  # a config class that cannot build from its own defaults
            missing[arch] = f"its config class fails on its defaults: {type(e).__name__}"
            continue
        d = json.loads(cfg.to_json_string(use_diff=False))
        d["architectures"] = [arch]
        _fix(arch, d)
        if d.get("torch_dtype") in (None, "float32") and d.get("dtype") in (None, "float32"):
            d["torch_dtype"] = "bfloat16"
        configs[arch] = d
    return configs, missing


def run_specs(configs: dict[str, dict[str, Any]], workers: int = 2) -> dict[str, dict[str, Any]]:
    """arch -> vLLM's answer (`vllm_specs.py`), the cases split across `workers` children."""
    from kvwatch.local.vllm_builder import run_spec_builder

    names = sorted(configs)
    parts = [names[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found: dict[str, dict[str, Any]] = {}
        for r in pool.map(lambda part: run_spec_builder({a: configs[a] for a in part}, 1800),
                          [p for p in parts if p]):  # fmt: skip
            found.update(r)
    return found


@dataclass(frozen=True)
class Row:
    architecture: str
    cls: str  # one of CLASSES
    arithmetic: str  # what the arithmetic said: its layer kinds, or its refusal
    vllm_path: str  # "sized: ...", "refused: ...", or why vLLM could not build it here
    detail: str = ""


def _kinds(layers: Any) -> str:
    counts: dict[str, int] = {}
    for sig in layers:
        key = sig[1] if sig[0] == "attention" else sig[0]
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def classify(arch: str, config: dict[str, Any] | None, answer: dict[str, Any] | None,
             missing: str | None = None) -> Row:  # fmt: skip
    """One architecture's class, from its config and vLLM's answer for it."""
    from kvwatch.sizing.archconfig import architecture_from_config
    from kvwatch.sizing.errors import SizingError
    from kvwatch.sizing.vllm_layers import layers_from_answer, signature

    if config is None or answer is None:
        return Row(arch, "no config class", "-", "-", missing or "")
    try:
        mine = signature(architecture_from_config(config, arch).layers)
        said = _kinds(mine)
    except SizingError as e:
        mine, said = None, f"refused: {e}"
    if "error" in answer:
        why = str(answer["error"])[:160]
        return Row(arch, "vLLM cannot build it here", said, f"cannot build: {why}")
    try:
        found = layers_from_answer(answer, arch)
        layers, shared = found.layers, found.shared
        theirs = signature(layers)
        path = f"sized: {_kinds(theirs)}" + (f" ({shared} layers share KV)" if shared else "")
    except SizingError as e:
        theirs, path = None, f"refused: {e}"
    if mine is None:
        return Row(arch, "refused", said, path)
    if theirs is not None and mine == theirs:
        return Row(arch, "equal", said, path)
    detail = "" if theirs is None else _first_difference(mine, theirs)
    return Row(arch, "WRONG", said, path, detail)


def _first_difference(mine: list[Any], theirs: list[Any]) -> str:
    if len(mine) != len(theirs):
        return f"{len(mine)} KV layers, vLLM has {len(theirs)}"
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b:
            return f"layer {i}: kvwatch {a}, vLLM {b}"
    return ""


def sweep(workers: int = 2, only: list[str] | None = None) -> tuple[str, list[Row]]:
    """(vLLM's version, one row per registry architecture)."""
    import vllm  # noqa: F401  (the version only; the models are built in children)

    archs = registry_architectures()
    if only is not None:
        archs = [a for a in archs if a in only]
    configs, missing = tiny_configs(archs)
    cases = dict(configs)
    for arch, config in configs.items():
        for tag, variant in variants(arch, config).items():
            cases[f"{arch} [{tag}]"] = variant
    answers = run_specs(cases, workers)
    rows = []
    for a in archs:
        rows.append(classify(a, configs.get(a), answers.get(a), missing.get(a)))
        rows += [classify(name, cases[name], answers.get(name)) for name in sorted(cases)
                 if name.startswith(f"{a} [")]  # fmt: skip
    return str(vllm.__version__), rows


def variants(arch: str, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Second readings of one family where its defaults leave a layout field unexercised: a
    model-wide sliding window where the class has one but its default is off (vLLM applies
    it to every layer unless layer_types says otherwise), and Falcon's other KV-head rules."""
    out: dict[str, dict[str, Any]] = {}
    if "sliding_window" in config and not config["sliding_window"]:
        out["sliding_window 64"] = dict(config, sliding_window=64, use_sliding_window=True)
    if arch == "Lfm2ForCausalLM":  # LFM2's published configs list the attention layers only
        out["full_attn_idxs only"] = {k: v for k, v in config.items() if k != "layer_types"}
    if arch == "FalconForCausalLM":
        out["multi_query off"] = dict(config, multi_query=False, new_decoder_architecture=False)
        out["new decoder, 2 KV heads"] = dict(
            config, new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=8,
            hidden_size=512,
        )  # fmt: skip
    return out


def rows_to_json(version: str, rows: list[Row]) -> dict[str, Any]:
    counts = {c: sum(r.cls == c for r in rows) for c in CLASSES}
    return {"vllm": version, "counts": counts, "rows": [asdict(r) for r in rows]}
