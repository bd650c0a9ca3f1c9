"""The families vLLM 0.32+ exports beside the core ones (prompt token sources, admission
rejections, CPU offload traffic): read under every spelling, turned into signals, absent (not
zero) where a server lacks them. The offload body is composed from vLLM 0.33.0's source (its
header says so); the 0.32 body was captured from the real CPU server."""

from __future__ import annotations

import math
import re
from pathlib import Path

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.signals import derive
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import EngineObservation, observe, prefix_cache_counts

DATA = Path(__file__).resolve().parents[2] / "data"
OFFLOAD = (DATA / "vllm-0.33-metrics-offload-composed.txt").read_text()
BUSY_032 = (DATA / "vllm-0.32-metrics-busy.txt").read_text()
MODEL = "/root/.cache/kvwatch/models/tiny-llama-30m-v1"
KEY = (MODEL, "0")
VICTIMS_BYTES = 16 * 12 * 256 * 1024  # what the composer stored and loaded


def _one(body: str) -> EngineObservation:
    (obs,) = observe(parse_exposition(body)).values()
    return obs


def _drop(body: str, pattern: str) -> str:
    return re.sub(rf"^{pattern}.*\n", "", body, flags=re.M)


def _bump(body: str, family: str, by: float) -> str:
    return re.sub(
        rf"^(vllm:{family}_total\{{.*\}} )(\S+)$",
        lambda m: f"{m[1]}{float(m[2]) + by}",
        body,
        flags=re.M,
    )


class TestRead:
    def test_offload_traffic_and_failures(self) -> None:
        obs = _one(OFFLOAD)
        assert obs.offload_load_bytes_total == VICTIMS_BYTES
        assert obs.offload_store_bytes_total == VICTIMS_BYTES
        assert obs.offload_allocation_failures_total == 3
        assert obs.offload_cpu_pinned == 0.25

    def test_the_older_spelling_by_transfer_type_alone(self) -> None:
        body = _drop(OFFLOAD, r"vllm:kv_offload_(load|store)_bytes")
        obs = _one(body.replace('transfer_type="CPU_to_GPU"} 5.0331648e+07',
                                'transfer_type="CPU_to_GPU"} 1000.0'))  # fmt: skip
        assert obs.offload_load_bytes_total == 1000
        assert obs.offload_store_bytes_total == VICTIMS_BYTES

    def test_both_spellings_are_not_added(self) -> None:
        # 0.33 writes the flat names and the deprecated ones for the same transfers
        assert _one(OFFLOAD).offload_store_bytes_total == VICTIMS_BYTES

    def test_the_vllm_underscore_spelling(self) -> None:
        obs = _one(OFFLOAD.replace("vllm:", "vllm_"))
        assert obs.offload_load_bytes_total == VICTIMS_BYTES
        assert obs.prompt_tokens_computed_total == 1036

    def test_prompt_sources(self) -> None:
        obs = _one(BUSY_032)
        assert obs.prompt_tokens_computed_total == 1036
        assert obs.prompt_tokens_cached_total == 0

    def test_a_server_without_offloading_has_none_not_zero(self) -> None:
        obs = _one(BUSY_032)
        assert obs.offload_load_bytes_total is None
        assert obs.offload_allocation_failures_total is None
        assert obs.offload_cpu_pinned is None
        assert obs.admission_rejections_total == 0  # the family is there, at zero

    def test_an_older_server_has_none_of_them(self) -> None:
        body = _drop(BUSY_032, r"vllm:(prompt_tokens_by_source|admission_rejections)")
        obs = _one(body)
        assert obs.prompt_tokens_computed_total is None
        assert obs.admission_rejections_total is None

    def test_rejections_are_booked_once_on_a_data_parallel_server(self) -> None:
        engine1 = "\n".join(
            line.replace('engine="0"', 'engine="1"')
            for line in BUSY_032.splitlines()
            if 'engine="0"' in line and not line.startswith("vllm:cache_config")
        )
        body = _bump(BUSY_032, "admission_rejections", 7) + engine1 + "\n"
        out = observe(parse_exposition(body))
        assert set(out) == {(MODEL, "0"), (MODEL, "1")}
        assert out[(MODEL, "0")].admission_rejections_total == 14  # 7 for each reason
        assert out[(MODEL, "1")].admission_rejections_total is None

    def test_an_untrue_pinned_share_is_refused(self) -> None:
        body = re.sub(r"^(vllm:kv_offload_cpu_cache_usage_perc\{.*\} )\S+$", r"\g<1>1.5",
                      OFFLOAD, flags=re.M)  # fmt: skip
        exp = parse_exposition(body)
        assert _one(body).offload_cpu_pinned is None
        assert exp.rejected.get("out_of_range", 0) >= 1


class TestSignals:
    def _signals(self, first: str, second: str):  # type: ignore[no-untyped-def]
        tl = Timeline()
        tl.add(0.0, _one(first))
        tl.add(1.0, _one(second))
        s = derive(tl, 1.0, Thresholds())
        assert s is not None
        return s

    def test_offload_rates_failures_and_rejections(self) -> None:
        later = _bump(OFFLOAD, "kv_offload_store_bytes", 2**20)
        later = _bump(later, "kv_offload_load_bytes", 2**19)
        later = _bump(later, "kv_offload_allocation_failure", 2)
        later = _bump(later, "admission_rejections", 5)
        s = self._signals(OFFLOAD, later)
        assert s.offload_store_bytes_per_s == 2**20
        assert s.offload_load_bytes_per_s == 2**19
        assert s.offload_allocation_failures_long == 2
        assert s.admission_rejections_long == 10  # 5 for each of the two reasons
        assert s.offload_cpu_pinned == 0.25

    def test_prompt_cache_share(self) -> None:
        later = re.sub(
            r'^(vllm:prompt_tokens_by_source_total\{.*source="(local_compute|local_cache_hit)"\} )'
            r"(\S+)$",
            lambda m: f"{m[1]}{float(m[3]) + (300 if m[2] == 'local_compute' else 100)}",
            BUSY_032,
            flags=re.M,
        )
        s = self._signals(BUSY_032, later)
        assert s.prompt_cache_hit_share is not None
        assert math.isclose(s.prompt_cache_hit_share, 0.25)

    def test_absent_families_stay_absent(self) -> None:
        s = self._signals(BUSY_032, BUSY_032)
        assert s.offload_store_bytes_per_s is None
        assert s.offload_allocation_failures_long is None
        assert s.prompt_cache_hit_share is None  # no prompt tokens in the window: no share
        assert s.admission_rejections_long == 0

    def test_a_restarted_server_counts_no_negative_traffic(self) -> None:
        restarted = _bump(OFFLOAD, "kv_offload_store_bytes", -VICTIMS_BYTES + 4096)
        s = self._signals(OFFLOAD, restarted)
        assert s.offload_store_bytes_per_s == 4096


def test_the_prefix_cache_counters_are_read_apart_from_the_external_ones() -> None:
    body = _bump(_bump(BUSY_032, "prefix_cache_hits", 512.0), "external_prefix_cache_queries", 9.0)
    obs = _one(body)
    assert (obs.prefix_cache_queries_total, obs.prefix_cache_hits_total) == (1036.0, 512.0)
    two = body + body.replace('engine="0"', 'engine="1"')
    assert prefix_cache_counts(observe(parse_exposition(two))) == (2072.0, 1024.0)
    bare = _one(_drop(BUSY_032, r"vllm:prefix_cache_(hits|queries)"))
    assert bare.prefix_cache_hits_total is None  # absent, not zero
