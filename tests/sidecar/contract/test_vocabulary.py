from __future__ import annotations

import re

from kvwatch.sidecar.contract import vocabulary as v


class TestVocabulary:
    def test_every_family_has_both_prefixes(self) -> None:
        for fam in v.FAMILIES:
            names = [n for n, _ in fam.sample_names()]
            assert any(n.startswith("vllm:") for n in names)
            assert any(n.startswith("vllm_") for n in names)

    def test_counter_spellings(self) -> None:
        assert v.WIRE_LOOKUP["vllm:num_preemptions_total"] == (v.PREEMPTIONS, "")
        assert v.WIRE_LOOKUP["vllm:num_preemptions"] == (v.PREEMPTIONS, "")
        assert "vllm:num_preemptions_created" not in v.WIRE_LOOKUP

    def test_promql_regex_matches_all_spellings_and_nothing_else(self) -> None:
        rx = re.compile(v.promql_metric(v.KV_USAGE))
        for name in ("vllm:kv_cache_usage_perc", "vllm_gpu_cache_usage_perc"):
            assert rx.fullmatch(name)
        assert not rx.fullmatch("vllm:kv_cache_usage_perc_total")
        rx = re.compile(v.promql_metric(v.PREEMPTIONS))
        assert rx.fullmatch("vllm:num_preemptions_total")
        assert rx.fullmatch("vllm_num_preemptions_total")
        assert v.promql_selector(v.RUNNING, 'engine="0"') == (
            '{__name__=~"vllm[:_]num_requests_running", engine="0"}'
        )

    def test_all_is_honest(self) -> None:
        for name in v.__all__:
            assert hasattr(v, name)
