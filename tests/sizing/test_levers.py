"""Every lever, with the flags the server's version has: versions from `/version` and the log's
banner, the `non-default args` line (secrets hidden), and the advice built on them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.sidecar.logs.logformats import Malformed, ServerStart, parse_line
from kvwatch.sidecar.logs.logstate import LogState
from kvwatch.sidecar.state.views import servers_from_json
from kvwatch.sizing.advice import Observed, advise
from kvwatch.sizing.kvmath import lookup_gpu
from kvwatch.sizing.levers import ServerInfo, has_flag, parse_version, valid_version

BANNER = "(APIServer pid=1) INFO 11-29 09:01:28 [api_utils.py:347]  ▄▄ ▄█ █     █  version 0.32.0"
OLD = "INFO 07-01 10:00:00 [api_server.py:1043] vLLM API server version 0.9.2"
ARGS = (
    "(APIServer pid=1) INFO 11-29 09:01:28 [api_utils.py:286] non-default args: {'port': 8000, "
    "'max_num_seqs': 64, 'scheduler_reserve_full_isl': False, 'api_key': ['sk-secret']}"
)


def spikes(**kw: object) -> Observed:
    """The fixture's spikes: 8 requests of 30 + 300 tokens on 40 blocks of 32."""
    base: dict[str, object] = dict(
        capacity_blocks=40, block_size=32, kv_bytes_per_token=8192, peak_demand=8,
        seq_len_p95=330, seq_len_max=330, prompt_len_p95=30, kv_cache_memory_bytes=10 * 2**20,
    )  # fmt: skip
    return Observed(**(base | kw))  # type: ignore[arg-type]


class TestVersions:
    def test_parse(self) -> None:
        assert parse_version("0.32.0") == (0, 32, 0)
        assert parse_version("0.10.1.1") == (0, 10, 1)
        assert parse_version("0.11.0rc2+cu128") == (0, 11, 0)
        assert parse_version("dev") is None and parse_version(None) is None
        assert valid_version("0.32.0") == "0.32.0"
        assert valid_version("0.3; rm -rf") is None and valid_version(32) is None

    def test_flags_by_release(self) -> None:
        assert has_flag("--max-num-active-seqs", (0, 31, 0))
        assert not has_flag("--max-num-active-seqs", (0, 30, 0))
        assert has_flag("--watermark", (0, 24, 0)) and not has_flag("--watermark", (0, 23, 0))
        assert has_flag("--scheduler-reserve-full-isl", (0, 19, 0))
        assert not has_flag("--scheduler-reserve-full-isl", (0, 18, 0))
        assert has_flag("--max-num-active-seqs", None)  # unknown: the newest kvwatch knows

    def test_log_lines(self) -> None:
        assert parse_line(BANNER) == ServerStart("0.32.0", None, "11-29 09:01:28")
        assert parse_line(OLD) == ServerStart("0.9.2", None, "07-01 10:00:00")
        ev = parse_line(ARGS)
        assert isinstance(ev, ServerStart) and ev.args is not None
        args = dict(ev.args)
        assert args["api_key"] == "<redacted>" and "sk-secret" not in repr(ev)
        assert args["scheduler_reserve_full_isl"] == "False" and args["max_num_seqs"] == "64"

    @pytest.mark.parametrize(
        "line",
        [
            "INFO x non-default args: {'a': __import__('os')}",
            "INFO x non-default args: {1: 2}",
            "INFO x non-default args: {" + "'a': 1, " * 5000 + "}",
        ],
    )
    def test_hostile_args_are_skipped(self, line: str) -> None:
        assert isinstance(parse_line(line), Malformed)

    def test_log_state_keeps_the_latest(self) -> None:
        log = LogState()
        for line in (OLD, ARGS, BANNER):
            ev = parse_line(line)
            assert ev is not None
            log.take(ev)
        assert log.version == "0.32.0" and dict(log.server_args)["port"] == "8000"

    def test_state_documents(self) -> None:
        doc = {"targets": [
            {"target": "a", "vllm_version": "0.30.0", "server_args": {"watermark": "0.1"}},
            {"target": "b", "vllm_version": "<script>", "server_args": ["x"]},
            {"target": "c"},
        ]}  # fmt: skip
        s = servers_from_json(doc)
        assert s["a"] == ServerInfo("0.30.0", (("watermark", "0.1"),))
        assert s["b"] == ServerInfo() and s["c"] == ServerInfo()
        assert servers_from_json([1]) == {}


class TestLevers:
    def test_the_cap_flag_follows_the_version(self) -> None:
        new = advise(spikes(), server=ServerInfo("0.32.0"))
        old = advise(spikes(), server=ServerInfo("0.30.1"))
        assert new.concurrency_flag == "--max-num-active-seqs"
        assert any(o.startswith("--max-num-active-seqs 3 ") for o in new.options)
        assert old.concurrency_flag == "--max-num-seqs"
        assert not any("--max-num-active-seqs" in o for o in old.options)
        assert (
            new.advised_for == "vLLM 0.32.0"
            and "advised for 0.33.0" in advise(spikes()).advised_for
        )

    def test_watermark_admits_the_cap(self) -> None:
        a = advise(spikes(), server=ServerInfo("0.32.0"))
        # 3 requests fit at the p95 length; 39 usable - 3 prompt blocks = 36 free = 0.9 of 40
        assert a.watermark == 0.9 and any(o.startswith("--watermark 0.9 ") for o in a.options)
        assert int(a.watermark * 40) > 39 - 4 * 1  # a 4th prompt is refused
        assert advise(spikes(), server=ServerInfo("0.20.0")).watermark is None  # no such flag

    def test_reserve_full_isl_when_it_is_off(self) -> None:
        off = ServerInfo("0.32.0", (("scheduler_reserve_full_isl", "False"),))
        assert any(
            o.startswith("--scheduler-reserve-full-isl")
            for o in advise(spikes(), server=off).options
        )
        assert not any("reserve-full-isl" in o for o in advise(spikes()).options)

    def test_priority_scheduling_says_what_the_sizing_holds(self) -> None:
        prio = ServerInfo("0.32.0", (("scheduling_policy", "'priority'"),))
        said = [x for x in advise(spikes(), server=prio).assumptions if "priority" in x]
        assert len(said) == 1 and "lowest-priority running requests give way" in said[0]
        assert not any("priority" in x for x in advise(spikes()).assumptions)

    def test_a_prefix_cache_losing_its_prefixes_gets_its_levers_and_its_cost(self) -> None:
        losing = dict(prompt_cache_hit_share_long=0.557, prompt_cache_hit_reference=0.934,
                      prompt_tokens_per_s_long=9038.0, prefix_cache_thrashing=True)  # fmt: skip
        roomy = spikes(capacity_blocks=400)  # fits for preemption
        a = advise(replace(roomy, **losing))
        assert a.verdict.startswith("fits for preemption, but the prefix cache loses")
        assert sum(o.startswith("prefix cache") for o in a.options) == 3
        assert any("= 3,407/s" in x for x in a.arithmetic)  # 9,038 x (93.4% - 55.7%)
        short = advise(replace(spikes(), **losing))  # also short for preemption
        assert short.verdict.startswith("undersized") and short.options[-1].startswith("prefix")
        quiet = losing | dict(prefix_cache_thrashing=False)
        assert not any(o.startswith("prefix") for o in advise(replace(roomy, **quiet)).options)

    def test_offloading_holds_what_does_not_fit(self) -> None:
        a = advise(spikes(), gpu=lookup_gpu("h100"), server=ServerInfo("0.32.0"))
        # 8 x 11 = 88 blocks at the peak, 39 usable: 49 blocks of 256 KiB = 0.012 GiB -> 0.1
        assert a.kv_offloading_gib == 0.1
        assert any("ms each way over pcie5" in x for x in a.arithmetic)

    def test_a_cpu_tier_that_refused_stores_is_grown(self) -> None:
        obs = spikes(kv_offloading_gib=0.5, offload_allocation_failures=3)
        a = advise(obs, server=ServerInfo("0.32.0"))
        assert a.kv_offloading_gib == 1.0  # twice the 0.5 GiB that ran out
        assert any("refused 3 stores" in x for x in a.arithmetic)
        assert any(o.startswith("--kv-offloading-size 1 ") for o in a.options)
        # a tier that never refused keeps the sizing from the peak alone
        assert (
            advise(spikes(kv_offloading_gib=0.5), server=ServerInfo("0.32.0")).kv_offloading_gib
            == 0.1
        )

    def test_what_the_newer_families_say_goes_into_the_assumptions(self) -> None:
        plain = advise(spikes()).assumptions
        assert any(x.startswith("prefix caching shares nothing") for x in plain)
        assert not any("refused" in x for x in plain)
        told = advise(spikes(prompt_cache_hit_share=0.4, admission_rejections=12)).assumptions
        assert any("prefix cache served 40% of prompt tokens" in x for x in told)
        assert any("vLLM refused 12 requests at its queue limits" in x for x in told)

    def test_recommendation(self) -> None:
        a = advise(spikes(), server=ServerInfo("0.32.0"))
        assert a.recommended is not None and a.recommended.startswith("more KV memory")
        fits = advise(spikes(peak_demand=2))
        assert fits.recommended is None and fits.options == []

    def test_the_recommendation_says_what_it_ends(self) -> None:
        # a cache that preempted: memory ends the preemption; one that bound by queueing
        # (requests waited for blocks, none was preempted): it ends the wait
        thrashed = advise(spikes(preemptions=36)).recommended
        assert thrashed is not None and "it ends the preemption" in thrashed
        queued = advise(spikes()).recommended
        assert queued is not None and "preemption" not in queued
        assert "instead of waiting for blocks" in queued

    def test_without_room_on_the_gpu_the_next_lever(self) -> None:
        # the L4 at 0.94 cannot give the KV 8 x 11 blocks of 8 MiB need: no room for memory
        big = spikes(kv_bytes_per_token=256 * 1024, gpu_memory_utilization=0.94,
                     kv_cache_memory_bytes=40 * 8 * 2**20)  # fmt: skip
        a = advise(big, gpu=lookup_gpu("l4"), server=ServerInfo("0.32.0"))
        assert a.gpu_memory_utilization is None and a.recommended is not None
        assert a.recommended.startswith("--max-num-active-seqs 3")
        half = advise(spikes(kv_bytes_per_token=256 * 1024, gpu_memory_utilization=0.94,
                             kv_cache_memory_bytes=40 * 8 * 2**20, peak_demand=6),
                      gpu=lookup_gpu("l4"))  # fmt: skip
        # 6 x 11 = 66 blocks: past 0.95 of the L4 too, but half-size blocks fit (2 x 39 x 0.9)
        assert half.fp8_suffices and half.recommended is not None
        assert half.recommended.startswith("--kv-cache-dtype fp8")


def test_the_sidecar_asks_the_version_when_a_target_comes_up() -> None:
    from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
    from kvwatch.sidecar.state.sidecar_state import SidecarState

    state = SidecarState(["http://t"])
    assert not state.wants_version("http://t", 0.0)  # not scraped yet
    state.targets["http://t"].up = True
    assert state.wants_version("http://t", 0.0)
    state.record_version("http://t", 0.0, None)  # it did not say
    assert not state.wants_version("http://t", 30.0) and state.wants_version("http://t", 60.0)
    state.record_version("http://t", 60.0, "0.32.0")
    assert not state.wants_version("http://t", 999.0)
    state.record_scrape("http://t", 1000.0, ScrapeOutcome(0.1, error_reason="connect", error="x"))
    assert state.targets["http://t"].api_version is None  # down: a restart may change it
