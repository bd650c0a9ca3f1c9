"""The sizing arithmetic: the seed's Llama 3.1 8B / H100 figures, the presets, and the rules by
which vLLM reads a config (hand-computed; tests/sizing/test_oracle.py checks vLLM itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.sizing.archconfig import AttentionLayer, architecture_from_config
from kvwatch.sizing.kvmath import (
    SizingError,
    blocks_for,
    decode_step_s,
    kv_bytes_per_token,
    lookup_gpu,
    lookup_model,
    model_from_config,
    victim_costs,
)
from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for, plan
from kvwatch.sizing.presets import GPU_PRESETS, MODEL_PRESETS

KIB, MIB = 1024, 1024**2


class TestLlama8bOnH100:
    def test_the_seed_figures_by_default(self) -> None:
        c = victim_costs(lookup_model("llama-3.1-8b"), lookup_gpu("h100"), 100, 1500)
        assert c.kv_bytes_per_token == 128 * KIB
        assert c.block_bytes == 2 * MIB
        assert c.new_blocks_per_step == pytest.approx(6.25)
        assert c.recompute_flops == pytest.approx(24e12, rel=0.01)
        assert c.recompute_s == pytest.approx(0.024, rel=0.03)
        assert c.swap_blocks == 94 and c.swap_bytes == 188 * MIB
        assert c.swap_s_each_way == pytest.approx(0.003, rel=0.05)
        # 16.06 GB of weights a step over 3.35 TB/s: the seed's idealized 4.8 ms step
        assert c.step_source == "roofline" and c.step_s == pytest.approx(0.0048, rel=0.01)
        assert c.regenerate_s == pytest.approx(7.2, rel=0.01)

    def test_step_override(self) -> None:
        c = victim_costs(lookup_model("llama-3.1-8b"), lookup_gpu("h100"), 100, 1500, step_s=0.01)
        assert c.step_source == "given" and c.regenerate_s == pytest.approx(15.0)

    def test_fp8_halves_and_tp_splits(self) -> None:
        m = lookup_model("llama-3.1-8b")
        assert kv_bytes_per_token(m, "fp8") == 64 * KIB
        assert kv_bytes_per_token(m, "bf16", tp=2) == 64 * KIB
        # more ranks than KV heads: vLLM keeps one head per rank (max(1, 8 // 16))
        assert kv_bytes_per_token(m, "bf16", tp=16) == 32 * 2 * 1 * 128 * 2

    def test_heads_per_rank_round_down_as_vllm(self) -> None:
        # 8 KV heads over TP 3: vLLM's get_num_kv_heads is 8 // 3 = 2, not ceil(8 / 3) = 3
        # (24 query heads: TP 3 must divide them, or vLLM refuses; Llama 3.1 8B's 32 it does not)
        m = _arch(num_hidden_layers=32, hidden_size=3072, num_attention_heads=24,
                  num_key_value_heads=8, head_dim=128)  # fmt: skip
        assert kv_bytes_per_token(m, "bf16", tp=3) == 32 * 2 * 2 * 128 * 2
        with pytest.raises(SizingError, match="not divisible by tensor-parallel size 3"):
            kv_bytes_per_token(lookup_model("llama-3.1-8b"), "bf16", tp=3)


class TestArchitectures:
    def test_mla_is_one_latent_per_layer(self) -> None:
        m = lookup_model("deepseek-v3")
        assert kv_bytes_per_token(m) == 61 * (512 + 64) * 2  # 70,272 B
        old = 61 * 2 * 128 * (7168 // 128) * 2  # the dense formula kvwatch used before
        assert old / kv_bytes_per_token(m) == pytest.approx(24.9, abs=0.1)
        assert kv_bytes_per_token(m, tp=8) == kv_bytes_per_token(m)  # replicated on every rank

    def test_moe_recompute_follows_active_parameters(self) -> None:
        m = lookup_model("deepseek-v3")
        c = victim_costs(m, lookup_gpu("h200"), 10, 1000)
        assert c.recompute_flops == pytest.approx(1000 * 2 * 37e9)
        q = lookup_model("qwen3-30b-a3b")
        assert q.params_active == 3.3e9 and q.params_total == 30.5e9

    def test_sliding_window_holds_the_window(self) -> None:
        m = lookup_model("gpt-oss-120b")
        assert m.kinds() == {"sliding 128": 18, "full": 18}
        lay = layout_for(m, Serving(max_model_len=8192), PLATFORMS["cuda"])
        sw, full = lay.groups  # layer 0 slides, so its bucket comes first, as in vLLM
        assert (sw.kind, full.kind) == ("sliding", "full")
        # at 4,008 tokens: full attention holds ceil(4008/16) = 251 blocks; the window's 128
        # tokens span 9 blocks (8 when the window starts on a block boundary, as at 4,000)
        assert full.held(4008) == 251 and sw.held(4008) == 9 and sw.held(4000) == 8
        assert lay.blocks_per_request(4008) == 260
        # in a step, only the full group grows: 1 block per 16 tokens
        assert lay.growth_per_step(4000) == pytest.approx(1 / 16)

    def test_gemma3_pattern_and_groups(self) -> None:
        m = lookup_model("gemma-3-27b")
        assert m.kinds() == {"sliding 1024": 52, "full": 10}
        lay = layout_for(m, Serving(max_model_len=8192), PLATFORMS["cuda"])
        # 10 full layers set the group size: 1 full group and ceil(52 / 10) = 6 sliding ones
        assert [g.kind for g in lay.groups].count("sliding") == 6
        assert sum(g.layers for g in lay.groups) == 62

    def test_chunked_local_frees_whole_chunks(self) -> None:
        m = lookup_model("llama-4-scout")
        assert m.kinds() == {"chunked 8192": 36, "full": 12}
        lay = layout_for(m, Serving(max_model_len=32768), PLATFORMS["cuda"])
        chunked = next(g for g in lay.groups if g.kind == "chunked")
        assert chunked.held(8192) == 512 and chunked.held(8193 + 16) == 2

    def test_hybrid_state_is_fixed(self) -> None:
        m = lookup_model("qwen3-next-80b-a3b")
        assert m.kinds() == {"gdn": 36, "full": 12}
        lay = layout_for(m, Serving(max_model_len=8192), PLATFORMS["cuda"])
        state = next(g for g in lay.groups if g.kind == "state")
        assert state.held(10) == state.held(100_000) == 2  # align mode: 2 + 0 checkpoint blocks
        no_pc = layout_for(m, Serving(8192, enable_prefix_caching=False), PLATFORMS["cuda"])
        assert next(g for g in no_pc.groups if g.kind == "state").held(10) == 1

    def test_pipeline_stages_take_the_widest(self) -> None:
        m = lookup_model("llama-3.1-70b")
        one = plan(m, Serving(8192), PLATFORMS["cuda"], 40 * 2**30)
        two = plan(m, Serving(8192, pp=2), PLATFORMS["cuda"], 40 * 2**30)
        assert two.num_gpu_blocks == 2 * one.num_gpu_blocks  # 40 layers a stage

    def test_every_preset_plans(self) -> None:
        for name in MODEL_PRESETS:
            m = lookup_model(name)
            tp = max(t for t in (1, 2, 4, 8) if m.attention_heads % t == 0)  # vLLM refuses others
            p = plan(m, Serving(4096, tp=tp), PLATFORMS["cuda"], 20 * 2**30)
            assert p.num_gpu_blocks > 0 and p.max_concurrency > 1, name
        for g in GPU_PRESETS.values():
            if not PLATFORMS[g.platform].is_cpu:
                assert g.memory_bytes and g.bf16_flops and g.hbm_bytes_per_s and g.link, g.name

    def test_roofline_step_per_gpu(self) -> None:
        m, h200, b200 = lookup_model("llama-3.1-70b"), lookup_gpu("h200"), lookup_gpu("b200")
        assert decode_step_s(m, h200, tp=4) == pytest.approx(70.6e9 * 2 / 4 / 4.8e12)
        assert decode_step_s(m, b200) < decode_step_s(m, h200)  # type: ignore[operator]
        assert decode_step_s(m, lookup_gpu("cpu")) is None


def _arch(**cfg: Any) -> Any:
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "num_key_value_heads": 2}  # fmt: skip
    return architecture_from_config(base | cfg)


class TestConfigRules:
    """What vLLM does where a config says one thing and vLLM another."""

    def test_sliding_window_zero_is_none(self) -> None:
        assert _arch(sliding_window=0).kinds() == {"full": 4}

    def test_model_wide_window_on_every_layer(self) -> None:
        assert _arch(model_type="mistral", sliding_window=4096).kinds() == {"sliding 4096": 4}

    def test_qwen_window_needs_use_sliding_window(self) -> None:
        q = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "sliding_window": 64}
        assert _arch(**q).kinds() == {"full": 4}
        # and slides only from max_window_layers (28 by default) on: none of 4 layers
        assert _arch(**q, use_sliding_window=True).kinds() == {"full": 4}
        on = _arch(**q, use_sliding_window=True, max_window_layers=0)
        assert on.kinds() == {"sliding 64": 4}

    def test_gpt_oss_slides_on_even_layers(self) -> None:
        g = _arch(
            architectures=["GptOssForCausalLM"],
            model_type="gpt_oss",
            sliding_window=128,
            layer_types=["full_attention"] * 4,
        )  # vLLM's gpt_oss.py ignores layer_types
        assert [x.kind for x in g.layers] == ["sliding", "full", "sliding", "full"]

    def test_layer_types(self) -> None:
        a = _arch(sliding_window=32,
                  layer_types=["sliding_attention", "full_attention"] * 2)  # fmt: skip
        assert [x.kind for x in a.layers] == ["sliding", "full", "sliding", "full"]

    def test_head_dim_and_text_config(self, tmp_path: Path) -> None:
        a = _arch(head_dim=128)
        assert isinstance(a.layers[0], AttentionLayer) and a.layers[0].head_size == 128
        mm = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
              "text_config": {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 2,
                              "model_type": "mistral"}}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(mm))
        assert model_from_config(tmp_path).kinds() == {"full": 3}

    def test_an_unknown_architecture_is_refused_in_one_short_line(self) -> None:
        """Fields that look dense are no proof: Falcon's `multi_query` leaves one KV head,
        Jamba's attention comes by period and offset. Unknown means refused, with the way to
        an exact answer, whatever the config sets."""
        for extra in ({}, {"sliding_window": 512}, {"multi_query": True}):
            with pytest.raises(SizingError) as e:
                _arch(architectures=["FancyForCausalLM"], **extra)
            msg = str(e.value)
            assert msg.startswith("FancyForCausalLM: not an architecture") and "vLLM" in msg
            assert len(msg) < 200 and "\n" not in msg
        with pytest.raises(SizingError, match="fancy: not an architecture"):
            _arch(architectures=[], model_type="fancy")
        assert _arch(architectures=[], model_type="llama").kinds() == {"full": 4}

    def test_hybrid_without_layer_map_is_refused(self) -> None:
        with pytest.raises(SizingError, match="GraniteMoeHybridForCausalLM.*layer_types"):
            _arch(architectures=["GraniteMoeHybridForCausalLM"], model_type="granitemoehybrid")

    def test_tiny_model_config(self, tiny_model: Path) -> None:
        m = model_from_config(tiny_model)
        assert kv_bytes_per_token(m) == 8 * KIB  # the fixture's 10 MiB = 40 blocks of 32
        assert 25e6 < m.params_total < 35e6


class TestBadFigures:
    def test_blocks_for(self) -> None:
        assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1
        assert blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2 and blocks_for(330, 32) == 11
        with pytest.raises(SizingError, match="negative"):
            blocks_for(-1, 16)

    def test_negative_lengths(self) -> None:
        with pytest.raises(SizingError, match="negative"):
            victim_costs(lookup_model("qwen2.5-7b"), lookup_gpu("a100"), 10, -5)

    def test_unknown_names(self) -> None:
        with pytest.raises(SizingError, match="unknown GPU 'tpu-v5'.*h100"):
            lookup_gpu("tpu-v5")
        with pytest.raises(SizingError, match="unknown model"):
            lookup_model("gpt-5")
        with pytest.raises(SizingError, match="unknown KV dtype"):
            Serving(1024, kv_dtype="int3")

    def test_cpu_block_sizes(self) -> None:
        with pytest.raises(SizingError, match="multiple of 32 on cpu"):
            layout_for(lookup_model("llama-3.1-8b"), Serving(1024, block_size=16), PLATFORMS["cpu"])

    def test_too_small_a_budget_is_refused_as_vllm_does(self) -> None:
        with pytest.raises(SizingError, match="refuses to start"):
            plan(lookup_model("llama-3.1-8b"), Serving(131072), PLATFORMS["cuda"], 2**30)

    def test_config_without_fields(self, tmp_path: Path) -> None:
        f = tmp_path / "config.json"
        f.write_text(json.dumps({"hidden_size": 64}))
        with pytest.raises(SizingError, match="names no architecture"):
            model_from_config(f)
        f.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
        with pytest.raises(SizingError, match="lacks num_hidden_layers"):
            model_from_config(f)
        f.write_text(
            json.dumps({"model_type": "llama", "num_hidden_layers": "8", "hidden_size": 64})
        )
        with pytest.raises(SizingError, match="num_hidden_layers must be a non-negative integer"):
            model_from_config(f)
        f.write_text("{oops")
        with pytest.raises(SizingError, match="not JSON"):
            model_from_config(f)
        f.write_text("[1]")
        with pytest.raises(SizingError, match="not a JSON object"):
            model_from_config(f)
        with pytest.raises(SizingError, match="cannot read"):
            model_from_config(tmp_path / "missing.json")
