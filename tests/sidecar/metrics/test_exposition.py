from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.sidecar.contract.vocabulary import (
    CACHE_CONFIG,
    ITL,
    KV_USAGE,
    PREEMPTIONS,
    REQUEST_PREEMPTIONS,
    RUNNING,
    WIRE_LOOKUP,
    Family,
    by_name,
)
from kvwatch.sidecar.metrics import exposition as exposition_module
from kvwatch.sidecar.metrics import observe as observe_module
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import OBSERVED, observe


def _reference(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """prometheus-client's reading of the samples our vocabulary keeps."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in WIRE_LOOKUP:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class TestParseExposition:
    def test_real_vllm_metrics_match_prometheus_client(self, data_dir: Path) -> None:
        for name in ("vllm-0.32-metrics-busy.txt", "vllm-0.32-metrics-idle.txt"):
            text = (data_dir / name).read_text()
            exp = parse_exposition(text)
            assert exp.error_count == 0
            ours = {}
            for fam_name, samples in exp.samples.items():
                fam = by_name(fam_name)
                for s in samples:
                    wire = next(
                        w for w, (f, suf) in WIRE_LOOKUP.items()
                        if f is fam and suf == s.suffix and w.startswith("vllm:")
                        and w.removeprefix("vllm:").startswith(fam.wire[0])
                        and (fam.kind != "counter" or w.endswith("_total"))
                    )  # fmt: skip
                    ours[(wire, tuple(sorted(s.labels.items())))] = s.value
            assert ours == _reference(text)

    def test_busy_values(self, data_dir: Path) -> None:
        exp = parse_exposition((data_dir / "vllm-0.32-metrics-busy.txt").read_text())
        (pre,) = exp.family(PREEMPTIONS)
        assert pre.value == 112.0 and pre.labels["engine"] == "0"
        (cfg,) = exp.family(CACHE_CONFIG)
        assert cfg.labels["num_gpu_blocks"] == "40" and "model_name" not in cfg.labels
        buckets = [s for s in exp.family(REQUEST_PREEMPTIONS) if s.suffix == "bucket"]
        assert [s.labels["le"] for s in buckets][:2] == ["1.0", "2.0"]

    def test_every_spelling(self) -> None:
        text = "\n".join(
            [
                'vllm_kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
                'vllm:gpu_cache_usage_perc{model_name="old"} 0.25',
                'vllm:num_preemptions{model_name="old"} 3',
                'vllm_num_preemptions_total{engine="1",model_name="m"} 7',
                'vllm:time_per_output_token_seconds_count{model_name="old"} 9',
                'vllm:num_preemptions_created{model_name="m"} 1.7e9',
            ]
        )
        exp = parse_exposition(text)
        assert sorted(s.value for s in exp.family(KV_USAGE)) == [0.25, 0.5]
        assert sorted(s.value for s in exp.family(PREEMPTIONS)) == [3.0, 7.0]
        assert exp.family(ITL)[0].suffix == "count"

    def test_escapes_timestamps_and_special_values(self) -> None:
        text = (
            'vllm:num_requests_running{model_name="a\\"b\\\\c\\nd",engine="0"} 4 1700000000000\n'
            'vllm:num_requests_waiting{model_name="x" , engine="0",} NaN\n'
            'vllm:request_num_preemptions_bucket{le="+Inf"} +Inf\n'
        )
        exp = parse_exposition(text)
        assert exp.error_count == 0
        (run,) = exp.samples["running"]
        assert run.labels == {"model_name": 'a"b\\c\nd', "engine": "0"} and run.value == 4
        # NaN and +Inf read as numbers, and are refused as untrue (counted, never kept)
        assert exp.rejected == {"not_finite": 2} and "request_preemptions" not in exp.samples

    def test_malformed_lines_are_counted_and_named(self) -> None:
        text = (
            'vllm:num_requests_running{model_name="m" 3\n'
            "vllm:num_requests_waiting{model_name=m} 1\n"
            "vllm:kv_cache_usage_perc{} banana\n"
            "vllm:num_preemptions_total\n"
            'vllm:num_requests_running{model_name="ok"} 2\n'
            "garbage that is not ours at all {{{\n"
        )
        exp = parse_exposition(text)
        assert exp.error_count == 4
        assert "line 1" in exp.errors[0] and "num_requests_running" in exp.errors[0]
        assert "bad sample value" in exp.errors[2]
        assert [s.value for s in exp.samples["running"]] == [2.0]

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=400))
    def test_random_text_never_raises(self, text: str) -> None:
        exp = parse_exposition(text)
        assert exp.error_count >= len(exp.errors)

    @settings(max_examples=200, deadline=None)
    @given(
        st.sampled_from(sorted(WIRE_LOOKUP)),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60),
    )
    def test_random_tails_on_known_names_never_raise(self, name: str, tail: str) -> None:
        exp = parse_exposition(name + tail)
        assert exp.error_count + sum(len(v) for v in exp.samples.values()) <= 1


class TestWhatAScrapeKeeps:
    """A scrape parses only what observe() reads (OBSERVED), each label set once."""

    def test_observe_reads_the_same_from_the_kept_lines(self, data_dir: Path) -> None:
        for name in ("vllm-0.32-metrics-busy.txt", "vllm-0.32-metrics-idle.txt",
                     "vllm-0.33-metrics-offload-composed.txt"):  # fmt: skip
            text = (data_dir / name).read_text()
            every, kept = parse_exposition(text), parse_exposition(text, OBSERVED)
            assert observe(kept) == observe(every), name
            assert sum(map(len, kept.samples.values())) < sum(map(len, every.samples.values()))

    def test_the_kept_families_are_those_observe_imports(self) -> None:
        # a family observe() starts to read without adding it to _READS would read as absent
        imported = {v for v in vars(observe_module).values() if isinstance(v, Family)}
        assert {f for f, _ in OBSERVED.values()} == imported

    def test_a_label_set_is_parsed_once_and_cannot_be_changed(self) -> None:
        text = 'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
        (a,) = parse_exposition(text).family(RUNNING)
        (b,) = parse_exposition(text.replace(" 3", " 4")).family(RUNNING)
        assert a.labels is b.labels and (a.value, b.value) == (3.0, 4.0)
        with pytest.raises(TypeError):
            a.labels["engine"] = "1"  # type: ignore[index]

    def test_label_sets_that_never_repeat_stay_bounded_and_right(self) -> None:
        n = exposition_module._LABEL_SETS_MAX + 500
        text = "\n".join(f'vllm:num_requests_running{{model_name="m{i}",engine="0"}} {i}'
                         for i in range(n))  # fmt: skip
        got = parse_exposition(text).family(RUNNING)
        assert [(s.labels["model_name"], s.value) for s in got] == [
            (f"m{i}", float(i)) for i in range(n)
        ]
        assert len(exposition_module._LABEL_SETS) <= exposition_module._LABEL_SETS_MAX
