"""vLLM's own layer specs as kvwatch layers, and the families the arithmetic learnt from the
registry sweep (bench/bench_arch_sweep.py), each pinned to what vLLM's model file does.

The pure part maps spec dicts as `kvwatch/local/vllm_specs.py` prints them; the live part
(integration) asks vLLM's model classes for real and checks the what-if against the figures
vLLM printed for the same configs (tests/advise/test_whatif.py has them for the arithmetic).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.sizing import kvmath
from kvwatch.sizing.archconfig import AttentionLayer, StateLayer, architecture_from_config
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import PLATFORMS, Serving, plan
from kvwatch.sizing.vllm_layers import layers_from_answer, layers_from_specs, signature

ARCH = Path(__file__).parents[1] / "data" / "architectures"
PROBES = {"kv": "fp8_e4m3", "state": "float16"}


def _attn(kind: str = "FullAttentionSpec", dtype: str = "uint8", **extra: Any) -> dict[str, Any]:
    return {"type": kind, "num_kv_heads": 2, "head_size": 64, "head_size_v": 64, "dtype": dtype,
            "kv_quant_mode": 1 if dtype == "uint8" else 0, "sliding_window": None,
            "attention_chunk_size": None, **extra}  # fmt: skip


def _state(dtypes: list[str], shapes: list[list[int]], **extra: Any) -> dict[str, Any]:
    return {"type": "MambaSpec", "shapes": shapes, "dtypes": dtypes, "mamba_type": "MAMBA2",
            "num_prefill_checkpoint_blocks": 1, **extra}  # fmt: skip


def _items(*specs: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [{"name": f"model.layers.{i}.attn", "index": i, "spec": s} for i, s in enumerate(specs)]


class TestSpecsToLayers:
    def test_kinds_heads_windows(self) -> None:
        layers, shared = layers_from_specs(
            _items(_attn(), _attn("SlidingWindowSpec", sliding_window=65),
                   _attn("ChunkedLocalAttentionSpec", attention_chunk_size=256),
                   {"type": "MLAAttentionSpec", "num_kv_heads": 1, "head_size": 576,
                    "dtype": "uint8", "kv_quant_mode": 1}),
            "m", "bfloat16", PROBES,
        )  # fmt: skip
        assert shared == 0
        assert [getattr(x, "kind", "mla") for x in layers] == ["full", "sliding", "chunked", "mla"]
        assert layers[1] == AttentionLayer("sliding", 2, 64, 64, 65)  # vLLM's window, as given

    def test_a_layer_that_keeps_the_model_dtype_under_an_fp8_probe_is_pinned(self) -> None:
        """Falcon's attention is built without the cache config: fp8 does not reach it."""
        (layer,), _ = layers_from_specs(_items(_attn(dtype="bfloat16")), "m", "bfloat16", PROBES)
        assert isinstance(layer, AttentionLayer) and layer.pinned_bytes == 2
        arch = architecture_from_config(
            {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 256,
             "num_attention_heads": 4, "num_hidden_layers": 2, "multi_query": True,
             "torch_dtype": "bfloat16", "max_position_embeddings": 2048})  # fmt: skip
        fp8 = plan(arch, Serving(1024, kv_dtype="fp8"), PLATFORMS["cuda"], 2**30)
        auto = plan(arch, Serving(1024), PLATFORMS["cuda"], 2**30)
        assert fp8.num_gpu_blocks == auto.num_gpu_blocks  # what vLLM does: fp8 changes nothing

    def test_states_by_the_dtype_each_follows(self) -> None:
        (s, _), _ = layers_from_specs(
            _items(_state(["bfloat16", "float16", "float32"], [[3, 640], [8, 64, 64], [2, 4]]),
                   _attn()),
            "m", "bfloat16", PROBES,
        )  # fmt: skip
        assert isinstance(s, StateLayer) and s.kind == "vllm" and s.mixer == "mamba2"
        assert s.shapes(1) == (3 * 640, 8 * 64 * 64) and s.fixed_bytes == 2 * 4 * 4
        with pytest.raises(SizingError, match="one unsharded rank"):
            s.shapes(2)

    @pytest.mark.parametrize(
        ("spec", "match"),
        [
            (_attn(kv_quant_mode=2), "kv_quant_mode"),
            (_attn(non_causal=True), "non_causal"),
            (_attn(dtype="int8", kv_quant_mode=0), "keeps its KV as int8"),
            ({"type": "RSWASpec"}, "as RSWASpec"),
            (_state(["bfloat16"], [[3, "x"]]), "not sizes"),
            ({**_attn(), "num_kv_heads": 0}, "num_kv_heads=0"),
            ("junk", "not a mapping"),
        ],
    )  # fmt: skip
    def test_what_it_cannot_size_exactly_is_refused(self, spec: Any, match: str) -> None:
        with pytest.raises(SizingError, match=match) as e:
            layers_from_specs(_items(_attn(), spec), "m", "bfloat16", PROBES)
        assert "\n" not in str(e.value)

    def test_attention_free_and_shared_layers(self) -> None:
        with pytest.raises(SizingError, match="attention-free"):
            layers_from_specs(_items(_state(["bfloat16", "float16"], [[3, 8], [2, 2, 2]])),
                              "m", "bfloat16", PROBES)  # fmt: skip
        items = [*_items(_attn()), {"name": "model.layers.1.attn", "index": 1,
                                    "shares": "model.layers.0.attn"}]  # fmt: skip
        assert layers_from_specs(items, "m", "bfloat16", PROBES)[1] == 1

    def test_an_answer_is_checked_where_it_enters(self) -> None:
        good = {"vllm": "0.32.0", "layers": _items(_attn()),
                "model": {"params": 10, "hidden_size": 128, "num_layers": 1,
                          "num_attention_heads": 2, "dtype": "bfloat16",
                          "probes": PROBES}}  # fmt: skip
        found = layers_from_answer(good, "m")
        assert found.source == "vllm 0.32.0 model classes" and found.params == 10
        for bad in ([], {"error": "boom\nline two"}, {**good, "model": {**good["model"],
                    "hidden_size": "x"}}, {**good, "layers": None}):  # fmt: skip
            with pytest.raises(SizingError) as e:
                layers_from_answer(bad, "m")
            assert "\n" not in str(e.value)


class TestCachedAnswers:
    def test_a_cached_answer_needs_no_child(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from kvwatch.local import vllm_builder

        fake = tmp_path / "vllm"
        fake.mkdir()
        (fake / "__init__.py").write_text("")
        monkeypatch.setenv("KVWATCH_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(vllm_builder, "vllm_installed", lambda: fake)
        monkeypatch.setattr(kvmath, "vllm_installed", lambda: fake)
        cfg = json.loads((ARCH / "llama" / "config.json").read_text())
        key = vllm_builder._key(cfg, vllm_builder._build_key(fake))
        path = tmp_path / "cache" / "vllm-layers" / f"{key}.json"
        path.parent.mkdir(parents=True)
        heads = cfg["num_key_value_heads"]
        head = cfg["hidden_size"] // cfg["num_attention_heads"]
        specs = [dict(_attn(), num_kv_heads=heads, head_size=head, head_size_v=head)
                 for _ in range(cfg["num_hidden_layers"])]  # fmt: skip
        path.write_text(json.dumps({"vllm": "9.9", "layers": _items(*specs), "model": {
            "params": 123456, "hidden_size": cfg["hidden_size"], "num_layers": len(specs),
            "num_attention_heads": cfg["num_attention_heads"], "dtype": "bfloat16",
            "probes": PROBES}}))  # fmt: skip
        arch = kvmath.architecture_for(cfg, "llama", "vllm")
        assert arch.layers_source == "kvwatch arithmetic, equal to vllm 9.9 model classes"
        assert arch.params_total == 123456
        path.write_text("{broken")  # an unreadable cache is rebuilt, here by a child that fails
        monkeypatch.setattr(vllm_builder, "_run_child", lambda c, t: {"error": "no vLLM here"})
        with pytest.raises(SizingError, match="no vLLM here"):
            kvmath.architecture_for(cfg, "llama", "vllm")
        # auto falls back on the arithmetic for a known architecture, and says so
        auto = kvmath.architecture_for(cfg, "llama", "auto")
        assert auto.layers_source == "kvwatch arithmetic" and "no vLLM here" in auto.notes[-1]

    def test_without_vllm(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(kvmath, "vllm_installed", lambda: None)
        from kvwatch.local import vllm_builder

        monkeypatch.setattr(vllm_builder, "vllm_installed", lambda: None)
        cfg = json.loads((ARCH / "llama" / "config.json").read_text())
        assert kvmath.architecture_for(cfg, "x", "auto").layers_source == "kvwatch arithmetic"
        with pytest.raises(SizingError, match="not installed"):
            kvmath.architecture_for(cfg, "x", "vllm")
        odd = dict(cfg, architectures=["OddForCausalLM"])
        with pytest.raises(SizingError) as e:
            kvmath.architecture_for(odd, "x", "auto")
        assert len(str(e.value)) < 200 and "OddForCausalLM" in str(e.value)


def _cfg(arch: str, model_type: str, **extra: Any) -> dict[str, Any]:
    return {"architectures": [arch], "model_type": model_type, "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8,
            "torch_dtype": "bfloat16", **extra}  # fmt: skip


class TestFamilies:
    """Each rule as vLLM 0.32's model file has it (the sweep holds them to vLLM's specs)."""

    @pytest.mark.parametrize(
        ("extra", "heads"),
        [({}, 1), ({"multi_query": False}, 4),
         ({"new_decoder_architecture": True, "num_kv_heads": 2}, 2)],
    )  # fmt: skip
    def test_falcon_kv_heads(self, extra: dict[str, Any], heads: int) -> None:
        a = architecture_from_config(_cfg("FalconForCausalLM", "falcon", **extra))
        assert {x.kv_heads for x in a.layers if isinstance(x, AttentionLayer)} == {heads}

    def test_jamba_attention_by_period_and_offset(self) -> None:
        a = architecture_from_config(_cfg("JambaForCausalLM", "jamba", num_hidden_layers=16,
                                          attn_layer_period=8, attn_layer_offset=4))  # fmt: skip
        kinds = [getattr(x, "kind", None) for x in a.layers]
        assert [i for i, k in enumerate(kinds) if k == "full"] == [4, 12]
        s = a.layers[0]
        assert isinstance(s, StateLayer) and s.shapes(2) == (3 * 256, 256 * 16)

    def test_falcon_h1_has_both_in_every_layer_and_zamba2_one_cache_per_hybrid(self) -> None:
        h1 = architecture_from_config(_cfg("FalconH1ForCausalLM", "falcon_h1", mamba_d_ssm=512,
                                           mamba_n_heads=8, mamba_d_state=16))  # fmt: skip
        assert h1.kinds() == {"full": 8, "mamba2": 8}
        z = architecture_from_config(_cfg(
            "Zamba2ForCausalLM", "zamba2", n_mamba_heads=8, mamba_d_state=16,
            layers_block_type=["mamba", "hybrid"] * 4))  # fmt: skip
        assert z.kinds() == {"full": 4, "mamba2": 8}
        attn = z.layers[0]
        assert isinstance(attn, AttentionLayer) and (attn.kv_heads, attn.head_size) == (4, 128)

    def test_lfm2_short_convolutions_and_gemma3n_shared_layers(self) -> None:
        lfm = architecture_from_config(_cfg(
            "Lfm2ForCausalLM", "lfm2", conv_dim=256, conv_L_cache=3,
            layer_types=["conv", "conv", "full_attention"] * 2 + ["conv", "conv"]))  # fmt: skip
        assert lfm.kinds() == {"short_conv": 6, "full": 2}
        by_index = architecture_from_config(_cfg("Lfm2ForCausalLM", "lfm2", conv_dim=256,
                                                 full_attn_idxs=[2, 5]))  # fmt: skip
        assert by_index.layers == lfm.layers
        conv = lfm.layers[0]
        assert isinstance(conv, StateLayer) and conv.shapes(2) == (2 * 128, 0)
        g = architecture_from_config(_cfg("Gemma3nForCausalLM", "gemma3n_text", head_dim=64,
                                          sliding_window=512, num_kv_shared_layers=3))  # fmt: skip
        assert g.layers[5:] == (None, None, None) and g.kinds()["sliding 512"] == 4
        no_window = architecture_from_config(_cfg("Gemma3nForCausalLM", "gemma3n_text",
                                                  head_dim=64, num_kv_shared_layers=3))  # fmt: skip
        assert no_window.kinds() == {"full": 5, "none": 3}

    def test_pinned_state_dtypes(self) -> None:
        """NemotronH's "auto" SSM state is float32 unless its config says otherwise; Qwen3.5's
        is its config's mamba_ssm_dtype (vLLM's models/config.py)."""
        nem = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
               "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_hidden_layers": 4, "hybrid_override_pattern": "M*M-", "mamba_num_heads": 8,
               "mamba_head_dim": 64, "ssm_state_size": 16, "n_groups": 1,
               "conv_kernel": 4}  # fmt: skip
        assert architecture_from_config(nem).state_dtype == "float32"
        half = architecture_from_config(dict(nem, mamba_ssm_cache_dtype="bfloat16"))
        assert half.state_dtype == "bfloat16"
        f32 = plan(architecture_from_config(nem), Serving(1024), PLATFORMS["cuda"], 2**30)
        bf16 = plan(half, Serving(1024), PLATFORMS["cuda"], 2**30)
        assert f32.layout.bytes_per_block > bf16.layout.bytes_per_block

    def test_head_size_from_hidden_where_vllm_ignores_head_dim(self) -> None:
        a = architecture_from_config(_cfg("OlmoeForCausalLM", "olmoe", head_dim=32))
        assert {x.head_size for x in a.layers if isinstance(x, AttentionLayer)} == {64}


def test_signature_leaves_out_layers_without_kv() -> None:
    a = architecture_from_config(_cfg("Gemma3nForCausalLM", "gemma3n_text", head_dim=64,
                                      sliding_window=512, num_kv_shared_layers=3))  # fmt: skip
    assert len(signature(a.layers)) == 5


@pytest.mark.integration
@pytest.mark.parametrize(
    ("config", "blocks", "tokens"),
    [("qwen3next", 53, 6030), ("deepseekv2", 94, 1504)],  # a hybrid and MLA: 7 s each
)
def test_the_vllm_path_equals_what_vllm_printed(config: str, blocks: int, tokens: int) -> None:
    """The same figures as tests/advise/test_whatif.py's, from vLLM's own specs this time."""
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--what-if", "--model", str(ARCH / config),
         "--gpu", "cpu", "--kv-cache-memory-bytes", "10485760", "--max-model-len", "1024",
         "--max-num-batched-tokens", "512", "--layers", "vllm", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stderr
    (item,) = json.loads(p.stdout)
    w = item["what_if"]
    assert (w["num_gpu_blocks"], w["kv_cache_size_tokens"]) == (blocks, tokens)
    assert "vllm 0.32" in w["layers_source"]
