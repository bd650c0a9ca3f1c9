"""Trace replay's pure parts: reading published traces as outside input, the replay plan, the
hit rate the trace implies, and prompts that share exactly the trace's prefixes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.loadgen.workload.arrivals import Replay, describe
from kvwatch.loadgen.workload.trace import (
    TraceError,
    TraceRequest,
    implied_hit_rate,
    plan_replay,
    read_trace,
    replay_offsets,
)
from kvwatch.loadgen.workload.trace_prompts import trace_prompts

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
MOONCAKE = TRACES / "mooncake-conversation-first120.jsonl"
AZURE = TRACES / "azure-llm-conv-2023-first120.csv"
_RNG = random.Random(3)
TOKENS = [_RNG.randrange(2, 5000) for _ in range(4000)]


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


class TestReading:
    def test_mooncakes_published_slice(self) -> None:
        tr = read_trace(MOONCAKE)
        assert tr.format == "mooncake" and len(tr.requests) == 120 and tr.skipped == {}
        first = tr.requests[0]
        assert (first.at_s, first.input_tokens, first.output_tokens) == (0.0, 6758, 500)
        assert first.hash_ids == tuple(range(14)) and tr.block_tokens == 512
        assert tr.requests[-1].at_s == pytest.approx(41.999)

    def test_azures_published_slice(self) -> None:
        tr = read_trace(AZURE)
        assert tr.format == "azure" and len(tr.requests) == 120
        assert (tr.requests[0].input_tokens, tr.requests[0].output_tokens) == (374, 44)
        # 18:15:46.6805900 -> 18:15:50.9951690
        assert tr.requests[1].at_s == pytest.approx(4.314579, abs=1e-6)
        assert all(r.hash_ids == () for r in tr.requests)

    def test_kvwatch_format_with_priorities(self, tmp_path: Path) -> None:
        f = _jsonl(tmp_path / "t.jsonl", [
            {"t": 1.5, "input_tokens": 40, "output_tokens": 5, "priority": 1},
            {"t": 0.25, "input_tokens": 30, "output_tokens": 2, "hash_ids": [7]},
        ])  # fmt: skip
        tr = read_trace(f)
        assert tr.format == "kvwatch"
        assert [r.at_s for r in tr.requests] == [0.25, 1.5]  # sorted by time
        assert tr.requests[0].hash_ids == (7,) and tr.requests[1].priority == 1
        assert [r.row for r in tr.requests] == [2, 1]

    def test_a_first_line_over_4_kb_is_recognised(self, tmp_path: Path) -> None:
        """The format was told from the first 4 KB: a long first record (a Mooncake row with
        thousands of hash ids) was not recognised."""
        f = _jsonl(tmp_path / "m.jsonl", [
            {"timestamp": 0, "input_length": 512 * 2000, "output_length": 3,
             "hash_ids": list(range(2000))},
        ])  # fmt: skip
        assert f.stat().st_size > 4096 and read_trace(f).format == "mooncake"

    def test_bad_rows_are_counted_by_reason_with_their_lines(self, tmp_path: Path) -> None:
        good = {"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [0]}
        f = _jsonl(tmp_path / "m.jsonl", [
            good,
            "{not json",
            {**good, "timestamp": -1},
            {**good, "input_length": 0},
            {**good, "output_length": 0},
            {**good, "hash_ids": [1, "x"]},
            {**good, "input_length": 2.5},
            '{"timestamp": NaN, "input_length": 10, "output_length": 3}',
            [1, 2],
            {**good, "hash_ids": [True]},
        ])  # fmt: skip
        tr = read_trace(f, "mooncake")
        assert len(tr.requests) == 1
        assert tr.skipped == {
            "not valid JSON": 1, "bad timestamp": 2, "bad input length": 2,
            "bad output length (a request must ask for at least 1 token)": 1,
            "bad hash_ids (a list of ids from 0)": 2, "not a JSON object": 1,
        }  # fmt: skip
        assert tr.examples["bad input length"] == [4, 7]

    def test_a_file_with_nothing_usable_says_why_in_one_line(self, tmp_path: Path) -> None:
        f = _jsonl(tmp_path / "m.jsonl", [{"timestamp": 1, "input_length": -3, "output_length": 1}])
        with pytest.raises(
            TraceError, match=r"no usable mooncake rows: 1 bad input length \(e.g. line 1\)"
        ):
            read_trace(f)

    def test_a_format_it_cannot_tell_names_the_flag(self, tmp_path: Path) -> None:
        f = _jsonl(tmp_path / "x.jsonl", [{"prompt": "hi"}])
        with pytest.raises(TraceError, match="--trace-format"):
            read_trace(f)
        with pytest.raises(TraceError, match="one of mooncake, azure, kvwatch"):
            read_trace(f, "sharegpt")

    def test_unreadable_and_binary_files(self, tmp_path: Path) -> None:
        with pytest.raises(TraceError, match="cannot read"):
            read_trace(tmp_path / "missing.jsonl")
        (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00garbage")
        with pytest.raises(TraceError, match="not UTF-8"):
            read_trace(tmp_path / "b.csv")

    def test_azure_rows_and_columns(self, tmp_path: Path) -> None:
        f = tmp_path / "a.csv"
        f.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
        with pytest.raises(TraceError, match="a.csv:1: .*needs the columns GeneratedTokens"):
            read_trace(f, "azure")
        f.write_text(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,2\n"
            "yesterday,10,2\n2023-11-16 18:15:47.5,ten,2\n2023-11-16 18:15:48.5,10,0\n"
            "2023-11-16 18:15:49.5,10\n\n2023-11-16 18:15:50.0,7,1\n"
        )
        tr = read_trace(f)
        assert [r.at_s for r in tr.requests] == [0.0, 3.5] and [r.row for r in tr.requests] == [
            2,
            8,
        ]
        assert sum(tr.skipped.values()) == 4 and tr.examples["bad timestamp"] == [3]


class TestPlan:
    def test_window_speed_and_caps(self) -> None:
        tr = read_trace(MOONCAKE)
        plan = plan_replay(tr, speed=2.0, window_s=(3.0, 30.0))
        assert plan.offsets_s[0] == 0.0 and plan.requests[0].at_s == pytest.approx(3.0)
        assert plan.offsets_s[-1] == pytest.approx((plan.requests[-1].at_s - 3.0) / 2)
        assert plan.left_out == 120 - len(plan.requests)
        capped = plan_replay(tr, max_requests=7, max_duration_s=100)
        assert len(capped.requests) == 7
        timed = plan_replay(tr, max_duration_s=3.0)
        assert timed.offsets_s[-1] < 3.0 and len(timed.requests) == 10

    @pytest.mark.parametrize(("start", "end"), [(1.0, 3.0), (4.0, 0.5)])
    def test_a_speed_that_moves_evenly_from_start_to_end(self, start: float, end: float) -> None:
        times = [x / 10 for x in range(1001)]  # ten requests a second for 100 s
        got = replay_offsets(times, start, end)
        assert got[-1] == pytest.approx(2 * 100 / (start + end))  # the mean speed's time
        assert 0.1 / (got[1] - got[0]) == pytest.approx(start, rel=0.03)
        assert 0.1 / (got[-1] - got[-2]) == pytest.approx(end, rel=0.03)
        half = got[-1] / 2  # halfway through the replay it runs at the mean of the two
        i = next(k for k, t in enumerate(got) if t >= half)
        assert 0.1 / (got[i + 1] - got[i]) == pytest.approx((start + end) / 2, rel=0.03)
        assert got == sorted(got) and replay_offsets(times, 2.0, None) == [x / 2 for x in times]

    def test_a_rising_replay_of_the_published_slice(self) -> None:
        tr = read_trace(AZURE)
        plan = plan_replay(tr, speed=1.0, speed_end=3.0)
        span = tr.requests[-1].at_s - tr.requests[0].at_s
        assert plan.speed_end == 3.0 and plan.offsets_s[-1] == pytest.approx(span / 2)
        assert len(plan.requests) == 120

    def test_lengths_scale_with_their_blocks_and_clip_to_the_context(self) -> None:
        tr = read_trace(MOONCAKE)
        plan = plan_replay(tr, length_scale=0.05, max_model_len=4096)
        assert plan.block_tokens == 26
        assert plan.requests[0].input_tokens == round(6758 * 0.05)
        assert plan.clipped == sum(
            1 for r in tr.requests if round(r.input_tokens * 0.05) + round(r.output_tokens * 0.05)
            > 4096
        ) > 0  # fmt: skip
        assert all(r.input_tokens + r.output_tokens <= 4096 for r in plan.requests)

    @pytest.mark.parametrize(
        ("kw", "msg"),
        [
            ({"speed": 0.0}, "speed"),
            ({"speed": float("inf")}, "speed"),
            ({"speed_end": 0.0}, "end speed"),
            ({"speed_end": float("nan")}, "end speed"),
            ({"length_scale": -1.0}, "length scale"),
            ({"length_scale": 0.01}, "at least 8"),
            ({"window_s": (5.0, 5.0)}, "START < END"),
            ({"window_s": (500.0, 600.0)}, "no request between 500 s and 600 s"),
        ],
    )
    def test_bad_options_are_refused(self, kw: dict[str, object], msg: str) -> None:
        with pytest.raises(TraceError, match=msg):
            plan_replay(read_trace(MOONCAKE), **kw)  # type: ignore[arg-type]


def _plan(*reqs: TraceRequest, block: int = 512):  # type: ignore[no-untyped-def]
    from kvwatch.loadgen.workload.trace import Trace

    return plan_replay(Trace(Path("t"), "kvwatch", tuple(reqs), block))


class TestImpliedHitRate:
    def test_whole_shared_blocks(self) -> None:
        plan = _plan(TraceRequest(0, 1024, 1, (0, 1)), TraceRequest(1, 1024, 1, (0, 2)))
        assert implied_hit_rate(plan) == 512 / 2048

    def test_a_partial_block_shares_what_was_sent_in_whole_server_blocks(self) -> None:
        plan = _plan(TraceRequest(0, 300, 1, (5,)), TraceRequest(1, 600, 1, (5, 6)))
        assert implied_hit_rate(plan, server_block=16) == 288 / 900  # 300 -> 18 blocks of 16

    def test_never_the_prompts_last_token(self) -> None:
        plan = _plan(TraceRequest(0, 512, 1, (7,)), TraceRequest(1, 512, 1, (7,)))
        assert implied_hit_rate(plan) == 496 / 1024  # 511 tokens -> 31 blocks of 16

    def test_sharing_stops_at_the_first_block_that_differs(self) -> None:
        plan = _plan(TraceRequest(0, 1536, 1, (0, 1, 2)), TraceRequest(1, 1536, 1, (0, 9, 2)))
        assert implied_hit_rate(plan) == 512 / 3072

    def test_on_mooncakes_slice(self) -> None:
        assert implied_hit_rate(plan_replay(read_trace(MOONCAKE))) == pytest.approx(
            0.0343, abs=1e-4
        )


class TestPrompts:
    def test_exact_lengths_and_exactly_the_trace_sharing(self) -> None:
        plan = _plan(
            TraceRequest(0, 1100, 1, (3, 4, 5)),
            TraceRequest(1, 700, 1, (3, 4)),
            TraceRequest(2, 600, 1, (8, 4)),
            TraceRequest(3, 40, 1),
            TraceRequest(4, 40, 1),
        )
        a, b, c, d, e = trace_prompts(plan, TOKENS, seed=1)
        assert [len(p) for p in (a, b, c, d, e)] == [1100, 700, 600, 40, 40]
        assert a[:700] == b  # same ids: the same tokens, the partial block a prefix of the whole
        assert a[:6] != c[:6]  # a different first id starts differently
        # block 4 after a different first block: the same tokens, which vLLM's chained block
        # hashes still tell apart (the trace's ids are chains too)
        assert c[512:] == a[512:600]
        assert d != e  # a request's own tokens are its own
        assert set(a) <= set(TOKENS)
        assert list(trace_prompts(plan, TOKENS, seed=1))[0] == a

    def test_the_seed_changes_the_text_not_the_sharing(self) -> None:
        plan = _plan(TraceRequest(0, 600, 1, (3, 4)), TraceRequest(1, 600, 1, (3, 4)))
        x1, y1 = trace_prompts(plan, TOKENS, seed=1)
        x2, _ = trace_prompts(plan, TOKENS, seed=2)
        assert x1 == y1 and x1 != x2

    def test_a_corpus_too_poor_to_write_ids_is_refused(self) -> None:
        plan = _plan(TraceRequest(0, 60, 1, (3,)))
        with pytest.raises(TraceError, match="10 distinct tokens"):
            next(trace_prompts(plan, list(range(10)) * 50))


class TestReplayPattern:
    def test_send_times_as_given_and_cut_at_the_duration(self) -> None:
        r = Replay((0.0, 0.0, 1.5, 4.0))
        assert list(r.offsets(random.Random(0), 2.0)) == [0.0, 0.0, 1.5]
        assert describe(r) == "trace replay, 4 requests" and "requests=4" in repr(r)

    @pytest.mark.parametrize("times", [(), (1.0, 0.5), (-1.0,), (float("nan"),)])
    def test_bad_times(self, times: tuple[float, ...]) -> None:
        with pytest.raises(ValueError, match="send time"):
            Replay(times)


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", "http://127.0.0.1:9",
         *args], capture_output=True, text=True, timeout=60,
    )  # fmt: skip


class TestCommandLine:
    def test_the_trace_is_the_load_so_other_loads_are_refused(self) -> None:
        p = _loadgen("--trace", str(MOONCAKE), "--rate", "3", "--shared-prefix", "10")
        assert p.returncode == 2
        assert "--trace is the load and the workload: drop --rate, --shared-prefix" in p.stderr
        assert "Traceback" not in p.stderr

    def test_bad_trace_options_fail_in_one_line_before_any_request(self, tmp_path: Path) -> None:
        p = _loadgen("--trace", str(MOONCAKE), "--trace-window", "10-20")
        assert p.returncode == 2 and "--trace-window wants START:END" in p.stderr
        p = _loadgen("--trace", str(tmp_path / "none.jsonl"))
        assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr


def test_naive_and_zoned_azure_times_are_a_counted_skip(tmp_path: Path) -> None:
    """Before: TypeError (naive minus aware) and a traceback."""
    from kvwatch.loadgen.workload.trace import read_trace

    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n"
                 "2023-11-16 18:15:47+00:00,10,5\n2023-11-16 18:15:48,10,5\n")  # fmt: skip
    t = read_trace(p)
    assert [r.row for r in t.requests] == [2, 4]
    assert t.skipped == {"timestamp with a time zone unlike the first row's": 1}


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"timestamp": 10**400, "input_length": 5, "output_length": 5}, "bad timestamp"),
        ({"timestamp": 1, "input_length": 10**30, "output_length": 5}, "bad input length"),
        ({"t": 1, "input_tokens": 5, "output_tokens": 5, "priority": 2**63}, "bad priority"),
    ],
)
def test_numbers_past_what_a_request_can_carry_are_a_counted_skip(
    tmp_path: Path, record: dict[str, int], why: str
) -> None:
    """Before: OverflowError for the timestamp and the lengths' scaling; a priority past 64 bits
    got every request a 400 from vLLM, then the run was lost."""
    from kvwatch.loadgen.workload.trace import read_trace

    p = tmp_path / "t.jsonl"
    good = ({"timestamp": 0, "input_length": 5, "output_length": 5} if "timestamp" in record
            else {"t": 0, "input_tokens": 5, "output_tokens": 5})  # fmt: skip
    p.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    t = read_trace(p)
    assert len(t.requests) == 1 and [k for k in t.skipped if k.startswith(why)], t.skipped


def test_a_traces_priorities_are_sent_and_priorities_fill_only_the_rest(tmp_path: Path) -> None:
    """Before: the replay's items carried no priority, so the rows' were never sent and
    --priorities gave every request a drawn one (docs/loadgen.md promises the row's is kept)."""
    from kvwatch.loadgen.workload.priorities import parse_priorities
    from kvwatch.loadgen.workload.spec import WorkloadSpec
    from kvwatch.loadgen.workload.trace import TraceReplay

    f = _jsonl(tmp_path / "t.jsonl", [
        {"t": i * 0.1, "input_tokens": 20, "output_tokens": 2,
         **({"priority": 7} if i % 2 == 0 else {})}
        for i in range(10)
    ])  # fmt: skip
    tokens = tuple(range(100, 400))
    plain = WorkloadSpec(trace=TraceReplay(f), tokens=tokens)
    assert [i.priority for i in plain.items()][:10] == [7, None] * 5
    mixed = WorkloadSpec(trace=TraceReplay(f), tokens=tokens, priorities=parse_priorities("0:1"))
    assert [i.priority for i in mixed.items()][:10] == [7, 0] * 5


def test_a_run_reads_its_trace_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run plans its replay twice (checked before the server is asked, then fitted to the
    server's context): a 100 MB trace was parsed and held twice (9.0 s and 1.08 GB; once:
    5.6 s, 654 MB). Changed on disk, it is read again."""
    import kvwatch.loadgen.workload.trace as trace_mod

    f = _jsonl(tmp_path / "t.jsonl", [{"t": 0, "input_tokens": 9, "output_tokens": 2}])
    reads = []
    real = trace_mod.read_trace
    monkeypatch.setattr(trace_mod, "read_trace", lambda *a: reads.append(a) or real(*a))
    trace_mod.TraceReplay(f, max_requests=5).plan()
    trace_mod.TraceReplay(f, max_requests=5, max_model_len=4096).plan()
    assert len(reads) == 1
    _jsonl(f, [{"t": 0, "input_tokens": 9, "output_tokens": 2}, {"t": 1, "input_tokens": 9,
                                                                "output_tokens": 2}])  # fmt: skip
    assert len(trace_mod.TraceReplay(f, max_requests=6).plan()[0].requests) == 2


def test_a_window_reads_only_its_rows_and_counts_the_rest(tmp_path: Path) -> None:
    """A short --trace-window of a big trace parses only its own rows (100 MB: 5.5 s and 667
    MB before, 1.1 s and 43 MB now, bench/bench_trace_read.py); the rest are counted, and a
    row whose time cannot be read without parsing it is parsed."""
    from kvwatch.loadgen.workload.trace import TraceReplay, replay_report

    f = tmp_path / "t.jsonl"
    rows = [json.dumps({"timestamp": ms, "input_length": 600, "output_length": 5})
            for ms in (0, 1000, 2000, 3000)]  # fmt: skip
    rows.insert(1, '{"timestamp": 9000, "input_length": broken')  # outside: never parsed
    rows.insert(2, '{"timestamp": 9000, "timestamp": 1500, "input_length": 7, "output_length": 1}')
    rows.append('{"timestamp": 2500, "input_length": broken')  # inside: parsed, and skipped
    f.write_text("\n".join(rows) + "\n")
    tr = read_trace(f, window_s=(1.0, 2.6))
    assert [(r.at_s, r.row) for r in tr.requests] == [(1.0, 4), (1.5, 3), (2.0, 5)]
    assert tr.outside_window == 3 and tr.skipped == {"not valid JSON": 1}
    replay = TraceReplay(f, window_s=(1.0, 2.6), max_requests=2)
    trace, plan = replay.plan()
    assert plan.left_out == 1 + 3  # over the cap, and outside the window
    rep = replay_report(replay, None, None)
    assert (rep["usable_rows"], rep["rows_outside_window"], rep["replayed"]) == (3, 3, 2)
    with pytest.raises(TraceError, match="no usable mooncake rows: 7 outside the window"):
        read_trace(f, window_s=(100.0, 200.0))
    assert len(read_trace(f).requests) == 5  # no window: every usable row
