"""The directory vLLM serves for the twin: the model's config.json and a tokenizer, no weights.

The config is the preset's (or the user's config.json), with two changes said at start: a
quantization config is dropped (no weights are read, so none is dequantized; the step model
still counts the quantized bytes), and a multimodal model is served as its text model (its KV
cache is the text model's). The tokenizer is the tiny model's; the twin samples ids it has.
Built once per config and reused (`$KVWATCH_CACHE/twin-models`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.local.tiny_model import build_dir_atomically, build_tokenizer, default_cache_dir
from kvwatch.sizing.archconfig import read_config
from kvwatch.sizing.presets import MODEL_PRESETS

__all__ = ["TwinModelDir", "twin_model_dir", "served_config"]

_MARKER = "kvwatch-twin.json"
_BUILD_VERSION = 1
BOS_ID, EOS_ID = 0, 1  # the tiny tokenizer's <s> and </s>
_BUILDING = threading.Lock()  # one build at a time in a process (twin_model_dir)


@dataclass(frozen=True)
class TwinModelDir:
    path: Path
    vocab: int  # ids the tokenizer has
    changes: tuple[str, ...]  # what the served config differs in, for the startup lines


def served_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config vLLM builds the twin's model from, and what was changed."""
    out = copy.deepcopy(cfg)
    changes: list[str] = []
    arch = (out.get("architectures") or [""])[0]
    text = out.get("text_config")
    if isinstance(text, dict) and str(arch).endswith("ForConditionalGeneration"):
        causal = str(arch).replace("ForConditionalGeneration", "ForCausalLM")
        text = dict(text)
        text.setdefault("torch_dtype", out.get("torch_dtype", "bfloat16"))
        text["architectures"] = [causal]
        out = text
        changes.append(f"served as its text model, {causal} (the KV cache is the text model's)")
    quant = out.pop("quantization_config", None)
    if isinstance(quant, dict):
        changes.append(
            f"its {quant.get('quant_method', 'quantized')} weights are not read; the step "
            "model counts their bytes"
        )
    out["bos_token_id"], out["eos_token_id"] = BOS_ID, EOS_ID
    out["tie_word_embeddings"] = bool(out.get("tie_word_embeddings", False))
    return out, changes


def _source(model: str) -> tuple[str, dict[str, Any]]:
    p = Path(model)
    if p.exists():
        return (p.parent.name if p.is_file() else p.name) or "model", read_config(p)
    key = model.strip().lower()
    if key not in MODEL_PRESETS:
        from kvwatch.sizing.errors import SizingError

        raise SizingError(f"unknown model {model!r}; known: {', '.join(sorted(MODEL_PRESETS))}")
    return key, MODEL_PRESETS[key].config


def twin_model_dir(model: str, cache_dir: Path | None = None) -> TwinModelDir:
    name, cfg = _source(model)
    served, changes = served_config(cfg)
    digest = hashlib.sha256(
        json.dumps([_BUILD_VERSION, served], sort_keys=True).encode()
    ).hexdigest()[:12]
    target = (cache_dir or default_cache_dir()) / "twin-models" / f"{name}-{digest}"
    vocab = _built(target)
    if vocab is not None:
        return TwinModelDir(target, vocab, tuple(changes))

    def fill(tmp: Path) -> int:
        (tmp / "config.json").write_text(json.dumps(served, indent=2, sort_keys=True) + "\n")
        vocab = build_tokenizer(tmp)
        (tmp / _MARKER).write_text(json.dumps({"vocab": vocab, "model": model}) + "\n")
        return vocab

    # a fleet starts its replicas in threads: one builds, the others wait and read what it
    # built. Two building at once each imported transformers, whose lazy module is not
    # thread-safe ("cannot import name 'PreTrainedTokenizerFast'" in a fresh clone), and the
    # second's rename removed the first's directory while its vLLM could be reading it
    with _BUILDING:
        vocab = _built(target)
        if vocab is None:
            vocab = build_dir_atomically(target, fill)
    return TwinModelDir(target, vocab, tuple(changes))


def _built(target: Path) -> int | None:
    """The vocabulary of a twin model directory built before; None where there is none."""
    try:
        return int(json.loads((target / _MARKER).read_text())["vocab"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
