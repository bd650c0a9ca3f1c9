"""vLLM's own KV specs for a config.json: its model classes built on the meta device, no engine.

`python -m kvwatch.local.vllm_specs` reads a JSON list of `{"id", "config"}` on stdin and
prints one line per case, `KVWATCH-SPECS {"id", "vllm", "layers", "model"}` or `{"id", "error"}`:
each layer vLLM's KV cache manager would see, by index, with the fields of its spec (as
`Attention.get_kv_cache_spec` returns it, the same call the twin's worker and vLLM's GPU model
runner make). Layers that read another layer's KV (`kv_sharing_target_layer_name`) are listed
with their target and no spec, as vLLM allocates nothing for them. `model` holds what the
built model says of itself: its class, its parameter count (exact: the meta tensors' sizes),
hidden size, layers, heads and vocabulary as vLLM reads them.

It runs only in a child process (`vllm_layers.py` starts it): building a model sets vLLM's
process-wide parallel state, and the lean core must never import vLLM.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import socket
import sys
import tempfile
import traceback
from fractions import Fraction
from pathlib import Path
from typing import Any

__all__ = ["MARK", "main"]

MARK = "KVWATCH-SPECS "


def _plain(v: Any) -> Any:
    """A spec field as JSON: dtypes and enums by name, fractions as text."""
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, Fraction):
        return str(v)
    if isinstance(v, enum.Enum):
        return str(v.name)
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    return str(v).replace("torch.", "")


def _spec_fields(spec: Any) -> dict[str, Any]:
    out = {f.name: _plain(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    out["type"] = type(spec).__name__
    out["page_size_bytes"] = int(spec.page_size_bytes)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Set on the cache config before the model is built, so each layer's spec says which dtype it
# follows: the KV cache's (these), the model's, or one its model file pins (Falcon's attention
# keeps the model dtype whatever --kv-cache-dtype says; Kimi's delta-attention state is float32)
PROBE_KV = "fp8_e4m3"
PROBE_STATE = {"bfloat16": "float16", "float16": "bfloat16", "float32": "float16"}


def _case(config: dict[str, Any], work: Path) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs

    config, changes = _served(config)
    (work / "config.json").write_text(json.dumps(config))
    args = EngineArgs(
        model=str(work),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=1024,
        max_num_batched_tokens=1024,
    )
    try:
        out = _build(args, probe=True)
    except Exception:  # a build that refuses the probe dtypes: without them, roles by order
        out = _build(args, probe=False)
    out["model"]["changes"] = changes
    return out


def _build(args: Any, probe: bool) -> dict[str, Any]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.utils.torch_utils import set_default_torch_dtype

    vc = args.create_engine_config()
    model_dtype = str(vc.model_config.dtype).replace("torch.", "")
    probes: dict[str, str] = {}
    if probe:
        cc = vc.cache_config
        probes = {"kv": PROBE_KV, "state": PROBE_STATE.get(model_dtype, "float16")}
        cc.cache_dtype = PROBE_KV
        cc.mamba_cache_dtype = "auto"
        cc.mamba_ssm_cache_dtype = probes["state"]
    layers: list[dict[str, Any]] = []
    try:
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                local_rank=0,
                backend="gloo",
            )
            ensure_model_parallel_initialized(1, 1)
            with set_default_torch_dtype(vc.model_config.dtype), torch.device("meta"):
                model = initialize_model(vllm_config=vc)
            found = get_layers_from_vllm_config(vc, AttentionLayerBase)  # type: ignore[type-abstract]
            for name, module in found.items():
                item: dict[str, Any] = {"name": name, "index": extract_layer_index(name)}
                target = getattr(module, "kv_sharing_target_layer_name", None)
                if target:
                    item["shares"] = target
                else:
                    spec = module.get_kv_cache_spec(vc)
                    item["spec"] = None if spec is None else _spec_fields(spec)
                layers.append(item)
            mc = vc.model_config
            facts = {
                "architecture": type(model).__name__,
                "params": int(sum(p.numel() for p in model.parameters())),
                "hidden_size": int(mc.get_hidden_size()),
                "num_layers": int(mc.get_total_num_hidden_layers()),
                "num_attention_heads": int(mc.get_num_attention_heads(vc.parallel_config)),
                "vocab_size": int(mc.get_vocab_size()),
                "dtype": model_dtype,
                "probes": probes,
            }
    finally:
        destroy_model_parallel()  # type: ignore[no-untyped-call]
        destroy_distributed_environment()  # type: ignore[no-untyped-call]
    return {"layers": layers, "model": facts}


def _served(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config vLLM builds here: a multimodal model's language model (its KV cache is the
    text model's; vision towers need libraries a sizing run should not), no quantization (no
    weights are read; the caller counts their bytes)."""
    from vllm.model_executor.models.registry import ModelRegistry

    out = dict(config)
    changes: list[str] = []
    archs = out.get("architectures") or [""]
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    text = out.get("text_config")
    causal = arch.replace("ForConditionalGeneration", "ForCausalLM")
    if isinstance(text, dict) and causal != arch and causal in ModelRegistry.get_supported_archs():
        text = dict(text)
        text.setdefault("torch_dtype", out.get("torch_dtype", "bfloat16"))
        text["architectures"] = [causal]
        out = text
        changes.append(f"its language model, {causal}")
    if out.pop("quantization_config", None) is not None:
        changes.append("without its quantization (no weights are read)")
    return out, changes


def _one_line(e: BaseException) -> str:
    """An error in one line: pydantic's say what failed on their second line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if type(e).__name__.endswith("ValidationError") and len(lines) > 2:
        lines = [lines[0], lines[1]]
    return f"{type(e).__name__}: {' / '.join(lines)}"[:300]


def main() -> None:
    cases = json.loads(sys.stdin.read())
    import vllm

    for case in cases:
        with tempfile.TemporaryDirectory(prefix="kvwatch-specs-") as tmp:
            try:
                result: dict[str, Any] = {
                    "vllm": vllm.__version__,
                    **_case(case["config"], Path(tmp)),
                }
            except BaseException as e:  # one case's refusal is that case's answer
                if isinstance(e, KeyboardInterrupt):
                    raise
                traceback.print_exc(file=sys.stderr)
                result = {"error": _one_line(e)}
        print(MARK + json.dumps(dict(id=case["id"], **result)), flush=True)
    sys.stdout.flush()
    os._exit(0)  # vLLM's teardown is slow and says nothing we need


if __name__ == "__main__":
    main()
