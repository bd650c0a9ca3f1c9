"""Every log format in docs/log-formats.md, plus real lines captured from the fixture server."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.sidecar.logs.logformats import (
    Capacity,
    IterationLine,
    Malformed,
    PreemptionWarning,
    StatsLine,
    parse_line,
    parse_text,
)
from tests.fuzzing import check_log_line

V0_WARNING = (
    "WARNING 05-12 10:15:03 [scheduler.py:1754] Sequence group cmpl-8f3c2a9e4b1d4f7a-0 is "
    "preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This "
    "can affect the end-to-end performance. Increase gpu_memory_utilization or "
    "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=51"
)
V0_WARNING_OLD_SWAP = (
    "WARNING 06-10 12:00:00 scheduler.py:1089] Sequence group 12 is preempted by "
    "PreemptionMode.SWAP mode because there is not enough KV cache space. This can affect the "
    "end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide "
    "more KV cache memory. total_num_cumulative_preemption=1"
)
V0_STATS = (
    "INFO 05-12 10:15:05 metrics.py:455] Avg prompt throughput: 512.3 tokens/s, Avg generation "
    "throughput: 98.1 tokens/s, Running: 31 reqs, Swapped: 2 reqs, Pending: 12 reqs, GPU KV cache "
    "usage: 99.2%, CPU KV cache usage: 4.5%."
)
_V1 = "Avg prompt throughput: 10.5 tokens/s, Avg generation throughput: 24.9 tokens/s, "
V1_GPU = f"INFO 07-01 12:00:00 [loggers.py:118] Engine 000: {_V1}Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%"  # noqa: E501
V1_PREEMPT = f"INFO 07-01 12:00:01 [loggers.py:123] Engine 001: {_V1}Running: 12 reqs, Waiting: 3 reqs, Preemptions: 4, GPU KV cache usage: 98.0%, Prefix cache hit rate: 12.5%"  # noqa: E501
V1_DEFERRED = f"(APIServer pid=7) INFO 11-29 07:51:27 [loggers.py:335] Engine 000: {_V1}Running: 5 reqs, Waiting: 21 reqs, Deferred: 2 reqs, Preemptions: 7, CPU KV cache usage: 100.0%, Prefix cache hit rate: 0.0%"  # noqa: E501
V1_AGGREGATED = f"INFO 10-02 09:00:00 [loggers.py:200] 4 Engines Aggregated: {_V1}Running: 40 reqs, Waiting: 9 reqs, XPU KV cache usage: 87.5%"  # noqa: E501
V1_NO_ENGINE = f"INFO 03-01 08:00:00 [loggers.py:80] {_V1}Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 50.0%"  # noqa: E501
CAP_TWO_LINES = [
    "INFO 08-01 10:00:00 [kv_cache_utils.py:829] GPU KV cache size: 438,672 tokens",
    "INFO 08-01 10:00:00 [kv_cache_utils.py:833] Maximum concurrency for 8,192 tokens per "
    "request: 53.55x",
]
CAP_ONE_LINE_GPU = (
    "INFO 09-01 10:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 438,672 tokens, Maximum "
    "concurrency for 8,192 tokens per request: 53.55x"
)
CAP_CPU = (
    "(EngineCore pid=2779) INFO 11-29 09:01:53 [kv_cache_utils.py:2327] CPU KV cache size: 1,280 "
    "tokens, Maximum concurrency for 1,024 tokens per request: 1.25x"
)
CAP_V0 = "INFO 05-12 10:14:50 [executor_base.py:112] # cuda blocks: 27417, # CPU blocks: 2048"
CAP_V0_GPU = "INFO 04-01 10:14:50 llm_engine.py:161] # GPU blocks: 2000, # CPU blocks: 512"


class TestParseLine:
    def test_v0_warning(self) -> None:
        ev = parse_line(V0_WARNING)
        assert ev == PreemptionWarning("cmpl-8f3c2a9e4b1d4f7a-0", "RECOMPUTE", 51, "05-12 10:15:03")
        old = parse_line(V0_WARNING_OLD_SWAP)
        assert isinstance(old, PreemptionWarning) and old.mode == "SWAP" and old.request_id == "12"

    def test_v0_stats(self) -> None:
        ev = parse_line(V0_STATS)
        assert isinstance(ev, StatsLine) and ev.era == "v0"
        assert (ev.running, ev.waiting, ev.swapped) == (31, 12, 2)
        assert ev.kv_usage == pytest.approx(0.992) and ev.cpu_kv_usage == pytest.approx(0.045)

    @pytest.mark.parametrize(
        ("line", "engine", "device", "running", "waiting", "deferred", "preempt", "kv", "hit"),
        [
            (V1_GPU, "000", "GPU", 1, 0, None, None, 0.003, 0.0),
            (V1_PREEMPT, "001", "GPU", 12, 3, None, 4, 0.98, 0.125),
            (V1_DEFERRED, "000", "CPU", 5, 21, 2, 7, 1.0, 0.0),
            (V1_AGGREGATED, "all", "XPU", 40, 9, None, None, 0.875, None),
            (V1_NO_ENGINE, None, "GPU", 2, 0, None, None, 0.012, 0.5),
        ],
    )
    def test_v1_stats_wordings(
        self,
        line: str,
        engine: str | None,
        device: str,
        running: int,
        waiting: int,
        deferred: int | None,
        preempt: int | None,
        kv: float,
        hit: float | None,
    ) -> None:
        ev = parse_line(line)
        assert isinstance(ev, StatsLine) and ev.era == "v1"
        assert (ev.engine, ev.device, ev.running, ev.waiting) == (engine, device, running, waiting)
        assert (ev.deferred, ev.preemptions) == (deferred, preempt)
        assert ev.kv_usage == pytest.approx(kv)
        assert ev.prefix_hit_rate == (None if hit is None else pytest.approx(hit))
        assert ev.prompt_tps == 10.5 and ev.generation_tps == 24.9

    def test_aggregated_engine_count(self) -> None:
        ev = parse_line(V1_AGGREGATED)
        assert isinstance(ev, StatsLine) and ev.engines == 4

    def test_capacity_eras(self) -> None:
        a, b = (parse_line(x) for x in CAP_TWO_LINES)
        assert a == Capacity(device="GPU", kv_tokens=438672, logged_at="08-01 10:00:00")
        assert b == Capacity(max_model_len=8192, max_concurrency=53.55, logged_at="08-01 10:00:00")
        one = parse_line(CAP_ONE_LINE_GPU)
        assert isinstance(one, Capacity)
        assert (one.device, one.kv_tokens, one.max_model_len, one.max_concurrency) == (
            "GPU", 438672, 8192, 53.55,
        )  # fmt: skip
        cpu = parse_line(CAP_CPU)
        assert isinstance(cpu, Capacity) and (cpu.device, cpu.kv_tokens) == ("CPU", 1280)
        v0 = parse_line(CAP_V0)
        assert isinstance(v0, Capacity) and (v0.device, v0.gpu_blocks, v0.cpu_blocks) == (
            "cuda", 27417, 2048,
        )  # fmt: skip
        v0g = parse_line(CAP_V0_GPU)
        assert isinstance(v0g, Capacity) and v0g.gpu_blocks == 2000

    @pytest.mark.parametrize(
        "line",
        [
            "INFO 11-29 09:01:53 [utils.py:347] Using LBHNC KV cache layout.",
            'INFO: 127.0.0.1:52054 - "GET /health HTTP/1.1" 200 OK',
            "Sequence group 5 is preempted by nothing in particular",
            "Engine 000: Avg prompt throughput: x tokens/s",
            "",
            "\x00\xff garbage",
        ],
    )
    def test_other_lines_are_ignored(self, line: str) -> None:
        assert parse_line(line) is None


class TestParseText:
    def test_all_formats_in_order(self) -> None:
        lines = [V0_WARNING, "noise", V0_STATS, V1_GPU, *CAP_TWO_LINES, CAP_V0, "x " * 50]
        kinds = [type(e).__name__ for e in parse_text("\n".join(lines))]
        assert kinds == ["PreemptionWarning", "StatsLine", "StatsLine", "Capacity", "Capacity",
                         "Capacity"]  # fmt: skip

    def test_real_fixture_log(self, data_dir: Path) -> None:
        text = (data_dir / "vllm-0.32-cpu-server.log").read_text()
        events = list(parse_text(text))
        caps = [e for e in events if isinstance(e, Capacity)]
        stats = [e for e in events if isinstance(e, StatsLine)]
        assert caps == [Capacity("CPU", 1280, 1024, 1.25, logged_at="11-29 09:01:53")]
        assert len(stats) == text.count("KV cache usage:")
        assert max(s.kv_usage for s in stats) == 1.0
        assert all(s.device == "CPU" and s.engine == "000" for s in stats)
        assert events == [e for e in map(parse_line, text.splitlines()) if e is not None]

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=500))
    def test_random_text_never_raises(self, text: str) -> None:
        for ev in parse_text(text):
            assert ev.kind in ("stats", "capacity", "preemption_warning", "server_start",
                               "iteration", "malformed", "incident_line")  # fmt: skip

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from([V0_WARNING, V0_STATS, V1_DEFERRED, CAP_CPU, CAP_V0]),
           st.integers(0, 400), st.text(max_size=20))  # fmt: skip
    def test_mangled_real_lines_never_raise(self, line: str, cut: int, junk: str) -> None:
        """A mangled line gives no event, a malformed one, or one whose figures can be true;
        the line left whole is still read."""
        mangled = line[:cut] + junk + line[cut:]
        for part in mangled.splitlines():
            check_log_line(part)
        events = list(parse_text(mangled))
        if not junk:
            assert events and not isinstance(events[0], Malformed), (line, events)


class TestVllm033:
    """0.33's variants, from tests/data/vllm-0.33-composed.log (composed from 0.33.0's source:
    no CPU build of 0.33 exists to capture one)."""

    def test_every_line_is_read(self, data_dir: Path) -> None:
        text = (data_dir / "vllm-0.33-composed.log").read_text()
        events = list(parse_text(text))
        kinds = [e.kind for e in events]
        assert kinds == ["server_start", "server_start", "capacity", "iteration", "iteration",
                         "iteration", "stats", "stats"]  # fmt: skip

    def test_iteration_details(self, data_dir: Path) -> None:
        text = (data_dir / "vllm-0.33-composed.log").read_text()
        its = [e for e in parse_text(text) if isinstance(e, IterationLine)]
        assert [i.index for i in its] == [1, 2, 3] and its[1].dummy and not its[0].dummy
        assert its[0].context_tokens == 2048 and its[2].kv_usage == pytest.approx(0.974)
        assert its[0].engine == "000" and its[0].device == "GPU" and its[0].elapsed_ms == 35.21

    def test_stats_line_with_kv_fetch(self, data_dir: Path) -> None:
        text = (data_dir / "vllm-0.33-composed.log").read_text()
        stats = [e for e in parse_text(text) if isinstance(e, StatsLine)]
        assert stats[0].kv_fetch == (1, 2, 0) and stats[0].deferred == 1
        assert stats[0].waiting == 2 and stats[0].prefix_hit_rate == pytest.approx(0.125)
        assert stats[1].kv_fetch == (0, 1, 3) and stats[1].kv_usage == pytest.approx(0.6)

    def test_an_impossible_iteration_is_malformed(self) -> None:
        line = ("Engine 000: Iteration(9): 1 context requests, 1 context tokens, 0 generation "
                "requests, 0 generation tokens, iteration elapsed time: 1.00 ms, GPU KV cache "
                "usage: 140.0%")  # fmt: skip
        assert isinstance(parse_line(line), Malformed)
