"""A quantized checkpoint's weights as vLLM loads them: the linear layers in the method's bits,
embeddings, LM head and the modules the config names at the model's dtype. Held to what vLLM
printed for two checkpoints nobody here made (dstackai/benchmarks, gpu-usage.md)."""

from __future__ import annotations

from kvwatch.sizing.archconfig import architecture_from_config
from kvwatch.sizing.presets import MODEL_PRESETS
from kvwatch.sizing.quantized import method_bytes

GIB = 2**30


def _arch(preset: str, quant: dict[str, object] | None) -> float:
    cfg = {k: v for k, v in MODEL_PRESETS[preset].config.items() if k != "quantization_config"}
    if quant is not None:
        cfg["quantization_config"] = quant
    a = architecture_from_config(cfg, preset)
    return a.weight_bytes_per_param * MODEL_PRESETS[preset].params_total


def test_metas_fp8_405b_loads_as_vllm_said() -> None:
    # vLLM: "Loading model weights took 56.7677 GB" (GiB) a card at TP 8; Meta's checkpoint
    # leaves attention and the first and last MLPs in bf16
    quant = {
        "quant_method": "fbgemm_fp8",
        "modules_to_not_convert": ["self_attn", "model.layers.0.mlp", "model.layers.125.mlp"],
    }
    per_card = _arch("llama-3.1-405b", quant) / 8 / GIB
    assert abs(per_card / 56.7677 - 1) < 0.01, per_card
    # read as one byte a parameter it would be 47 GiB: 9.5 GiB of KV budget a card too many
    assert MODEL_PRESETS["llama-3.1-405b"].params_total / 8 / GIB < 48


def test_amds_fp8_405b_within_four_percent() -> None:
    # amd/Llama-3.1-405B-Instruct-FP8-KV (Quark): "Loading model weights took 49.3235 GB" a
    # card at TP 8; every linear layer fp8, embeddings and LM head bf16
    quant = {
        "quant_method": "quark",
        "global_quant_config": {"weight": {"dtype": "fp8_e4m3"}},
        "exclude": ["lm_head"],
    }
    per_card = _arch("llama-3.1-405b", quant) / 8 / GIB
    assert -0.04 < per_card / 49.3235 - 1 < 0, per_card


def test_compressed_tensors_fp8_is_not_read_as_bf16() -> None:
    # RedHat's FP8 checkpoints: quant_method compressed-tensors, 8-bit weights, lm_head ignored;
    # it was read as bf16 before (16 GB of an 8B model where the checkpoint is 9 GB)
    quant = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
        "ignore": ["lm_head"],
    }
    gb = _arch("llama-3.1-8b", quant) / 1e9
    assert 8.9 < gb < 9.3, gb


def test_bits_by_method() -> None:
    assert method_bytes({"quant_method": "fp8"}) == 1.0
    assert method_bytes({"quant_method": "mxfp4"}) == 4.25 / 8
    assert method_bytes({"quant_method": "modelopt", "quant_algo": "NVFP4"}) == 4.5 / 8
    assert method_bytes({"quant_method": "bitsandbytes", "load_in_8bit": True}) == 1.0
    g128 = method_bytes({"quant_method": "gptq", "bits": 4, "group_size": 128})
    assert g128 is not None and 0.5 < g128 < 0.53
    assert method_bytes({"quant_method": "gptq", "bits": 4, "group_size": -1}) == 0.5
    assert method_bytes({"quant_method": "gptq", "bits": 8, "group_size": True}) == 1.0
    w4 = {"weights": {"num_bits": 4, "group_size": 128}}
    assert method_bytes({"quant_method": "compressed-tensors", "config_groups": {"g": w4}}) == (
        0.5 + 2 / 128
    )
    assert method_bytes({"quant_method": "something-new"}) is None


def test_an_unknown_method_is_said_and_counted_at_the_dtype() -> None:
    cfg = dict(MODEL_PRESETS["llama-3.1-8b"].config)
    cfg["quantization_config"] = {"quant_method": "something-new"}
    a = architecture_from_config(cfg, "x")
    assert a.weight_bytes_per_param == 2.0
    assert any("something-new" in n and "not one kvwatch reads" in n for n in a.notes)


def test_named_modules_stay_at_the_dtype_and_routers_cost_nothing() -> None:
    plain = _arch("gpt-oss-120b", {"quant_method": "mxfp4"})
    shipped = _arch("gpt-oss-120b", MODEL_PRESETS["gpt-oss-120b"].config["quantization_config"])  # type: ignore[arg-type]
    # attention in bf16 adds a little; the router entry does not keep the experts whole
    assert 1.0 < shipped / plain < 1.05
    unknown = {"quant_method": "fp8", "ignore": ["vision_tower"]}
    cfg = dict(MODEL_PRESETS["llama-3.1-8b"].config, quantization_config=unknown)
    assert any("1 of the modules" in n for n in architecture_from_config(cfg, "x").notes)
    one_proj = {"quant_method": "fp8", "ignore": ["model.layers.3.self_attn.k_proj"]}
    all_attn = {"quant_method": "fp8", "ignore": ["model.layers.3.self_attn"]}
    base = _arch("llama-3.1-8b", {"quant_method": "fp8"})
    assert base < _arch("llama-3.1-8b", one_proj) < _arch("llama-3.1-8b", all_attn)
