"""The sizing arithmetic, pinned to the Llama 3.1 8B / H100 example and hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.sidecar.kvmath import (
    ModelShape,
    SizingError,
    blocks_for,
    kv_bytes_per_token,
    lookup_gpu,
    lookup_model,
    model_from_config,
    victim_costs,
)

KIB, MIB = 1024, 1024**2


class TestLlama8bOnH100:
    def test_the_documented_figures(self) -> None:
        c = victim_costs(
            lookup_model("llama-3.1-8b"),
            lookup_gpu("h100"),
            running=100,
            victim_tokens=1500,
            block_size=16,
            step_s=0.0048,
        )
        assert c.kv_bytes_per_token == 128 * KIB
        assert c.block_bytes == 2 * MIB
        assert c.new_blocks_per_step == pytest.approx(6.25)
        assert c.recompute_flops == pytest.approx(24e12, rel=0.01)
        assert c.recompute_s == pytest.approx(0.024, rel=0.03)
        assert c.swap_blocks == 94 and c.swap_bytes == 188 * MIB
        assert c.swap_s_each_way == pytest.approx(0.003, rel=0.05)
        assert c.regenerate_s == pytest.approx(7.2)

    def test_fp8_halves_and_tp_splits(self) -> None:
        m = lookup_model("llama-3.1-8b")
        assert kv_bytes_per_token(m, "fp8") == 64 * KIB
        assert kv_bytes_per_token(m, "bf16", tp=2) == 64 * KIB
        # more ranks than KV heads: heads are replicated, one per rank
        assert kv_bytes_per_token(m, "bf16", tp=16) == 32 * 2 * 1 * 128 * 2

    def test_70b(self) -> None:
        assert kv_bytes_per_token(lookup_model("llama-3.1-70b")) == 80 * 2 * 8 * 128 * 2


class TestHandComputed:
    def test_tiny_model_config(self, tiny_model: Path) -> None:
        m = model_from_config(tiny_model)
        assert (m.layers, m.kv_heads, m.head_dim) == (8, 4, 64)
        assert kv_bytes_per_token(m) == 8 * KIB  # the fixture's 10 MiB = 40 blocks of 32
        assert 25e6 < m.params < 35e6

    def test_blocks_for(self) -> None:
        assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1
        assert blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2 and blocks_for(330, 32) == 11


class TestBadFigures:
    def test_negative_lengths(self) -> None:
        with pytest.raises(SizingError, match="negative"):
            blocks_for(-1, 16)
        with pytest.raises(SizingError, match="negative"):
            victim_costs(lookup_model("qwen2.5-7b"), lookup_gpu("a100"), 10, -5)

    def test_unknown_names(self) -> None:
        with pytest.raises(SizingError, match="unknown GPU 'tpu-v5'.*h100"):
            lookup_gpu("tpu-v5")
        with pytest.raises(SizingError, match="unknown model"):
            lookup_model("gpt-5")
        with pytest.raises(SizingError, match="unknown KV dtype"):
            kv_bytes_per_token(lookup_model("mistral-7b"), "int3")

    def test_config_without_fields(self, tmp_path: Path) -> None:
        f = tmp_path / "config.json"
        f.write_text(json.dumps({"hidden_size": 64}))
        with pytest.raises(SizingError, match="lacks num_hidden_layers, num_attention_heads"):
            model_from_config(f)
        f.write_text("{oops")
        with pytest.raises(SizingError, match="not JSON"):
            model_from_config(f)
        with pytest.raises(SizingError, match="cannot read"):
            model_from_config(tmp_path / "missing.json")

    def test_shape_must_be_positive(self) -> None:
        with pytest.raises(SizingError, match="layers must be positive"):
            ModelShape("x", 0, 8, 128, 1e9)
