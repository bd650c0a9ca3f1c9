"""Sessions' pure parts: what each turn sends, how answers join the context, the per-turn
summary, and the flags' errors (tests/twin/test_sessions_live.py sends them to the twin)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.results.summary import render_turns, summarize_records
from kvwatch.loadgen.send.client import _CHUNK, _take_chunk
from kvwatch.loadgen.workload.lengths import DatasetError
from kvwatch.loadgen.workload.sessions import Conversations, SessionShape, parse_think_time
from kvwatch.loadgen.workload.token_blocks import TokenBlocks

_RNG = random.Random(5)
TOKENS = tuple(_RNG.randrange(2, 9000) for _ in range(6000))


def _talks(**kw: object) -> Conversations:
    return Conversations(SessionShape(**kw), TOKENS, seed=1)  # type: ignore[arg-type]


class TestTurns:
    def test_each_turn_resends_the_conversation_with_the_servers_answer(self) -> None:
        talk = _talks(turns="3", first_input_len="100", turn_input_len="20",
                      output_len="7").open(0)  # fmt: skip
        assert talk.turns == 3
        [(p0, n0)] = talk.calls(0)
        assert (len(p0), n0) == (100, 7)
        answer = [11, 12, 13, 14, 15, 16, 17]
        talk.join([(p0, n0)], [answer])
        [(p1, _)] = talk.calls(1)
        assert len(p1) == 127 and p1[:100] == p0 and list(p1[100:107]) == answer

    def test_an_agents_turn_fans_out_and_joins_in_order(self) -> None:
        talk = _talks(turns="3", first_input_len="50", turn_input_len="10", output_len="4",
                      fanout=3).open(2)  # fmt: skip
        first = talk.calls(0)
        assert len(first) == 1  # the user's opening is one call
        talk.join(first, [[1, 1, 1, 1]])
        calls = talk.calls(1)
        assert len(calls) == 3 and {len(p) for p, _ in calls} == {64}
        assert len({p[54:] for p, _ in calls}) == 3  # each its own tool message
        talk.join(calls, [[2] * 4, [3] * 4, [4] * 4])
        [(p2, _)] = talk.calls(2)[:1]
        assert len(p2) == 54 + 3 * 14 + 10
        assert p2[54:68] == calls[0][0][54:] + (2, 2, 2, 2)
        assert p2[82:96] == calls[2][0][54:] + (4, 4, 4, 4)

    def test_sessions_share_the_system_prompt_and_nothing_else(self) -> None:
        talks = _talks(first_input_len="80", system_prompt=32)
        a, b = (talks.open(n).calls(0)[0][0] for n in (0, 1))
        assert a[:32] == b[:32] and a[32:38] != b[32:38]
        again = _talks(first_input_len="80", system_prompt=32).open(1).calls(0)[0][0]
        assert again == b  # the seed and the number fix it, in any worker process

    def test_think_times(self) -> None:
        assert parse_think_time("0") is None
        talk = _talks(think_time="uniform:1,3").open(0)
        assert all(1 <= talk.think_s() <= 3 for _ in range(50))
        assert _talks().open(0).think_s() == 0.0
        with pytest.raises(DatasetError, match="think time"):
            parse_think_time("soon")

    @pytest.mark.parametrize(
        ("kw", "msg"),
        [({"turns": "many"}, "numbers expected"), ({"fanout": 0}, "--fanout 0"),
         ({"output_len": "uniform:5,2"}, "LO <= HI")],
    )  # fmt: skip
    def test_bad_shapes_fail_before_the_run(self, kw: dict[str, object], msg: str) -> None:
        with pytest.raises(DatasetError, match=msg):
            SessionShape(**kw).check()  # type: ignore[arg-type]

    def test_numbered_blocks_refuse_numbers_past_their_limit(self) -> None:
        with pytest.raises(ValueError, match="outside"):
            TokenBlocks(TOKENS).block(2**42, 10)


def test_the_answers_token_ids_are_collected_from_the_stream() -> None:
    rec = RequestRecord("r", 0.0, output_token_ids=[])
    for body in (b'{"choices":[{"text":"ab","token_ids":[5,6]}]}',
                 b'{"choices":[{"text":"c","token_ids":[7]}]}',
                 b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}'):  # fmt: skip
        _take_chunk(_CHUNK.decode(body), rec, 1.0)
    assert rec.output_token_ids == [5, 6, 7] and rec.output_tokens == 3
    plain = RequestRecord("r", 0.0)
    _take_chunk(_CHUNK.decode(b'{"choices":[{"text":"ab","token_ids":[5,6]}]}'), plain, 1.0)
    assert plain.output_token_ids is None


def test_the_summary_has_a_row_per_turn() -> None:
    def rec(sid: str, turn: int, ttft: float, ok: bool = True) -> dict[str, object]:
        r = RequestRecord(f"main/{sid}/t{turn}", 0.0, stage="main", session=sid, turn=turn,
                          sent_at=0.0, first_token_at=ttft, finished_at=ttft + 1,
                          token_times=[ttft, ttft + 1], prompt_tokens=100 * (turn + 1),
                          output_tokens=2, error=None if ok else "HTTP 500")  # fmt: skip
        return r.to_dict()

    records = [rec("s0", 0, 0.1), rec("s0", 1, 0.1), rec("s1", 0, 0.2), rec("s1", 1, 0.4, False)]
    s = summarize_records(records)["sessions"]
    assert s["sessions"] == 2 and s["cut"] == 1
    assert s["turns"]["0"]["requests"] == 2 and s["turns"]["1"]["requests"] == 1
    assert s["turns"]["1"]["prompt_tokens_mean"] == 200
    text = render_turns({"sessions": s})
    assert text is not None and "2 sessions, 1 cut short by a failed turn" in text
    assert render_turns(summarize_records([])) is None


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", "http://127.0.0.1:9",
         "--rate", "1", "--duration", "5", *args], capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "msg"),
    [(["--sessions", "--chat"], "--sessions sends token-exact conversations: drop --chat"),
     (["--sessions", "--turns", "x"], "numbers expected"),
     (["--sessions", "--trace", "t.jsonl"], "drop --sessions"),
     (["--turns", "3", "--fanout", "2"], "--turns, --fanout: only with --sessions")],
)  # fmt: skip
def test_session_flags_fail_in_one_line(args: list[str], msg: str) -> None:
    p = _loadgen(*args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr


class TestWorkingSet:
    @staticmethod
    def _turn(sid: str, sent: float, done: float, prompt: int, out: int) -> dict[str, object]:
        return {"session": sid, "ok": True, "sent_at": sent, "finished_at": done,
                "prompt_tokens": prompt, "output_tokens": out}  # fmt: skip

    def test_the_peak_of_the_live_contexts(self) -> None:
        from kvwatch.loadgen.results.working_set import session_working_set

        recs = [
            self._turn("a", 0.0, 1.0, 100, 17), self._turn("a", 3.0, 4.0, 150, 17),
            self._turn("b", 2.0, 2.5, 100, 17),  # b's only turn: held until it ends at 2.5
            self._turn("c", 3.5, 5.0, 64, 1),
            {"session": "d", "ok": False, "sent_at": 3.6, "finished_at": 3.7},
        ]  # fmt: skip
        ws = session_working_set(recs, block_size=16)
        assert ws is not None
        # at 2.0: a holds its first turn until its next (100 + 16: the answer but its last
        # token, 8 blocks), b the same; at 3.5 a holds 166 (11 blocks) and c 64 (4): fewer
        assert (ws.peak_blocks, ws.peak_tokens, ws.sessions_at_peak, ws.at_s) == (16, 232, 2, 2.0)
        assert ws.advised_blocks == 19  # 16 x 1.1 -> 18, and the null block

    def test_a_fanned_out_turn_holds_the_context_once(self) -> None:
        from kvwatch.loadgen.results.working_set import session_working_set

        recs = [self._turn("a", 0.0, 1.0, 100, 1)] + [
            self._turn("a", 2.0, 3.0, 110, 5)
            for _ in range(3)  # context 100 + 10 each
        ]
        ws = session_working_set(recs, block_size=1)
        assert ws is not None and ws.peak_tokens == 3 * 114 - 2 * 100

    def test_fanned_out_calls_are_one_turn_though_sent_microseconds_apart(self) -> None:
        """Before: grouped by exact send time, each call counted as a turn of its own (at
        fanout 4, 60 blocks advised where 80 were needed)."""
        from kvwatch.loadgen.results.working_set import session_working_set

        recs = [{**self._turn("a", 0.0, 1.0, 100, 1), "turn": 0}] + [
            {**self._turn("a", 2.0 + k * 1e-5, 3.0, 110, 5), "turn": 1} for k in range(3)
        ]
        ws = session_working_set(recs, block_size=1)
        assert ws is not None and ws.peak_tokens == 3 * 114 - 2 * 100

    def test_a_shared_system_prompt_is_held_once(self) -> None:
        from kvwatch.loadgen.results.working_set import session_working_set

        recs = [self._turn(s, 0.0, 1.0, 96, 1) for s in "abc"]
        ws = session_working_set(recs, block_size=16, shared_tokens=32)
        assert ws is not None and ws.peak_blocks == 3 * 6 - 2 * 2

    def test_the_advice_says_the_bytes_that_hold_it(self) -> None:
        from kvwatch.loadgen.results.working_set import (
            render_working_set,
            session_working_set,
            working_set_advice,
        )

        ws = session_working_set([self._turn("a", 0.0, 1.0, 1600, 1)], block_size=16)
        assert ws is not None and ws.advised_blocks == 112  # 100 x 1.1 + 1 + rounding
        small = working_set_advice(ws, {"num_blocks": 50, "kv_cache_memory_bytes": 50 * 2048})
        assert small["fits"] is False and small["advised_kv_cache_memory_bytes"] == 112 * 2048
        assert "give it --kv-cache-memory-bytes 229376" in render_working_set(small)
        big = working_set_advice(ws, {"num_blocks": 500})
        assert big["fits"] and render_working_set(big).endswith("it holds them")
        assert "does not say" in render_working_set(working_set_advice(ws, None))


def test_worker_processes_number_their_sessions_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed-loop sessions split over worker processes: every session number once, and the
    cap on sessions shared out, as the one-process run would open them."""
    import asyncio

    from kvwatch.loadgen.send import runner
    from kvwatch.loadgen.workload.arrivals import Concurrency
    from kvwatch.loadgen.workload.schedule import Stage

    opened: list[int] = []

    async def fake_session(sender: object, stage: object, talk: object, due: float) -> None:
        opened.append(talk.number)  # type: ignore[attr-defined]
        await asyncio.sleep(0)

    class Pool:
        async def warm(self, n: int) -> None:
            pass

    class Sender:
        pool = Pool()

    monkeypatch.setattr(runner, "_session", fake_session)
    talks = Conversations(SessionShape(), TOKENS, 1)
    stage = Stage("main", Concurrency(3), None, 10)
    for index in range(2):
        share = runner.Share(index, 2)
        asyncio.run(runner._session_stage(Sender(), stage, random.Random(0), share, talks))  # type: ignore[arg-type]
    assert sorted(opened) == list(range(10))
