"""Which layers slide, as transformers derives it and vLLM follows it (checked against vLLM in
test_oracle.py's qwen2 cases)."""

from __future__ import annotations

from typing import Any

import pytest

from kvwatch.sizing.archconfig import AttentionLayer, architecture_from_config
from kvwatch.sizing.errors import SizingError

QWEN2: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
    "torch_dtype": "bfloat16", "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "use_sliding_window": True, "sliding_window": 64,
}  # fmt: skip


def _windows(cfg: dict[str, Any]) -> list[int | None]:
    layers = architecture_from_config(cfg, "q").layers
    return [x.window if isinstance(x, AttentionLayer) else None for x in layers]


def test_qwen_slides_only_from_max_window_layers_on() -> None:
    assert _windows(QWEN2) == [None] * 6  # max_window_layers 28 by default: none of 6 slide
    assert _windows(QWEN2 | {"max_window_layers": 6}) == [None] * 6
    assert _windows(QWEN2 | {"max_window_layers": 0}) == [64] * 6
    assert _windows(QWEN2 | {"use_sliding_window": False, "max_window_layers": 0}) == [None] * 6
    qwen3 = QWEN2 | {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert _windows(qwen3 | {"max_window_layers": 0}) == [64] * 6


def test_a_mix_that_vllm_refuses_is_refused() -> None:
    with pytest.raises(SizingError, match="some but not all layers"):
        _windows(QWEN2 | {"max_window_layers": 4})


def test_layer_types_in_the_config_win() -> None:
    types = ["full_attention", "sliding_attention"] * 3
    assert _windows(QWEN2 | {"layer_types": types, "max_window_layers": 6}) == [None, 64] * 3
    with pytest.raises(SizingError, match="some but not all layers"):
        _windows(QWEN2 | {"layer_types": types})  # max_window_layers 28 is not 6


def test_a_negative_q_lora_rank_is_no_rank() -> None:
    """Found by the config fuzz target (CI, 2026-12-05): a DeepSeek-V2 config with q_lora_rank
    -1335 gave a negative parameter count; a rank that is not a count is now no rank."""
    cfg = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
           "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
           "model_type": "deepseek_v2", "kv_lora_rank": 512, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 128,
           "first_k_dense_replace": 1, "moe_layer_freq": 1}  # fmt: skip
    bad = architecture_from_config({**cfg, "q_lora_rank": -1335})
    none = architecture_from_config(cfg)
    assert bad.params_total == none.params_total > 0
    assert bad.params_active == none.params_active > 0
