from __future__ import annotations

import pytest

from kvwatch.loadgen.results.records import RequestRecord, StallRule
from kvwatch.loadgen.results.stall_causes import CAUSES
from kvwatch.loadgen.results.summary import (
    SloError,
    parse_slo,
    render_table,
    summarize_records,
    timing_caveat,
)


def rec(i: int, due: float, sent: float, tokens: list[float], stage: str = "s",
        error: str | None = None) -> RequestRecord:  # fmt: skip
    r = RequestRecord(f"r{i}", due, stage=stage, sent_at=sent, token_times=tokens, error=error)
    if tokens:
        r.first_token_at, r.finished_at = tokens[0], tokens[-1]
        r.output_tokens = len(tokens)
        r.prompt_tokens = 10
    else:
        r.finished_at = sent + 0.1
    return r


class TestRecords:
    def test_derived_fields(self) -> None:
        r = rec(0, 1.0, 1.5, [2.0, 2.1, 2.2, 2.3, 4.3, 4.4])
        d = r.to_dict(t0=1.0)
        assert d["scheduled_at"] == 0 and d["sent_at"] == 0.5
        assert d["dispatch_lag"] == pytest.approx(0.5)
        assert d["ttft"] == pytest.approx(0.5) and d["ttft_from_scheduled"] == pytest.approx(1.0)
        assert d["e2e"] == pytest.approx(2.9) and d["e2e_from_scheduled"] == pytest.approx(3.4)
        assert d["tpot"] == pytest.approx(2.4 / 5)
        assert sum(d["gaps"]) == pytest.approx(4.4 - 2.0)
        assert d["stalls"] == 1 and d["stall_time"] == pytest.approx(2.0)
        assert d["stall_spans"] == [[pytest.approx(1.3), pytest.approx(3.3)]]  # from t0

    def test_stall_rule(self) -> None:
        assert StallRule(5, 0.25).where([0.01] * 10 + [0.2]) == []  # under the floor
        assert StallRule(5, 0.25).where([0.1] * 10 + [0.6]) == [10]
        assert StallRule().where([5.0, 5.0]) == []  # too few gaps to judge


class TestSlo:
    def test_parse(self) -> None:
        assert parse_slo("ttft=500ms,tpot=50ms,e2e=2s") == {"ttft": 0.5, "tpot": 0.05, "e2e": 2}
        assert parse_slo("") == {}

    @pytest.mark.parametrize("bad", ["ttft", "speed=1s", "ttft=fast", "ttft=0ms"])
    def test_bad(self, bad: str) -> None:
        with pytest.raises(SloError):
            parse_slo(bad)


class TestSummary:
    def test_stage_and_goodput(self) -> None:
        records = [
            rec(0, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4]).to_dict(),
            rec(1, 1.0, 1.0, [1.9, 2.0, 2.1, 2.2]).to_dict(),
            rec(2, 2.0, 2.0, [], error="HTTP 500: boom").to_dict(),
            rec(3, 0.0, 0.0, [0.1, 0.2], stage="w").to_dict() | {"warmup": True},
        ]
        s = summarize_records(records, {"ttft": 0.5})
        o = s["overall"]
        assert (o["requests"], o["completed"], o["failed"]) == (3, 2, 1)
        assert o["errors"] == {"HTTP 500": 1}
        assert o["duration_s"] == pytest.approx(2.2)
        assert o["goodput"] == pytest.approx(1 / 2.2) and o["slo_attainment"] == pytest.approx(
            1 / 3
        )
        assert "w" not in s["stages"]
        table = render_table(s)
        assert "overall" in table and "2/3" in table
        assert o["stalls_preempting"] is None  # never judged: no server timeline

    def test_stalls_preempting_needs_every_stall_judged(self) -> None:
        stalled = rec(0, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4, 2.0]).to_dict()
        calm = rec(1, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4]).to_dict()
        for r, n in ((stalled, 1), (calm, 0)):
            r["stalls_preempting"] = n
        assert summarize_records([stalled, calm])["overall"]["stalls_preempting"] == 1
        stalled["stalls_preempting"] = None
        summary = summarize_records([stalled, calm])
        assert summary["overall"]["stalls_preempting"] is None
        assert render_table(summary).splitlines()[0].split()[-2:] == ["preempting", "goodput"]

    def test_stall_causes_by_count_and_seconds_in_the_summary_and_the_table(self) -> None:
        stalled = rec(0, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4, 2.0, 2.1, 4.0]).to_dict()
        calm = rec(1, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4]).to_dict()
        assert len(stalled["stall_spans"]) == 2
        summary = summarize_records([stalled, calm])
        assert "stall_causes" not in summary["overall"]  # not judged: no server timeline
        stalled["stall_causes"], calm["stall_causes"] = ["preempted", "prefill"], []
        summary = summarize_records([stalled, calm])
        causes = summary["overall"]["stall_causes"]
        assert set(causes) == set(CAUSES)
        assert causes["preempted"]["stalls"] == 1 and causes["prefill"]["stalls"] == 1
        assert causes["prefill"]["seconds"] == pytest.approx(1.9)
        assert causes["host"] == {"stalls": 0, "seconds": 0.0}
        header, *_, overall = render_table(summary).splitlines()
        assert "causes" in header.split() and "prefill 1, preempted 1" in overall

    def test_timing_caveat_only_when_requests_left_late(self) -> None:
        on_time = summarize_records([rec(0, 0.0, 0.0005, [0.1, 0.2]).to_dict()])
        assert timing_caveat(on_time) is None
        late = summarize_records([rec(0, 0.0, 0.042, [0.1, 0.2]).to_dict()])
        caveat = timing_caveat(late)
        assert caveat is not None and caveat.startswith("dispatch lag p99 42 ms")
        assert timing_caveat({"overall": {"requests": 0}}) is None  # nothing was sent
