"""The twin's step trace: written and read back, and the true cause of a stall read from it."""

from __future__ import annotations

from pathlib import Path

from kvwatch.loadgen.results.stall_truth import engine_to_server_ids, truth_causes
from kvwatch.loadgen.results.step_trace import StepRecord, StepTraceWriter, read_step_trace

SID = "kvw0a1b2c3d-main/7"
EID = f"cmpl-{SID}-0-5f3e9a1c"  # vLLM 0.32's id of a completion sent with X-Request-Id: SID


def _decode(end: float, **kw: object) -> StepRecord:
    return StepRecord(end=end, card_s=kw.pop("card_s", 0.02), requests=8,  # type: ignore[arg-type]
                      prefill=0, recompute=0, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_a_trace_is_written_and_read_back_with_bad_lines_counted(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    w = StepTraceWriter(path)
    steps = [_decode(2.0, preempted=(EID,)), _decode(1.0, skipped=("x",))]
    assert all(w.write(s) for s in steps)
    w.close()
    with path.open("a") as f:
        f.write('{"end": 3.0, "card_s": "fast"}\n[1]\n{"end": 3.0\n\n')
    got, bad = read_step_trace(path)
    assert got == sorted(steps, key=lambda s: s.end) and bad == 3


def test_a_full_disk_stops_the_trace_not_the_engine() -> None:
    w = StepTraceWriter(Path("/dev/full"))  # every write fails once the buffer is flushed
    assert not all(w.write(_decode(float(i))) for i in range(2000))
    assert w.error and "OSError" in w.error and not w.write(_decode(1.0))


def test_engine_ids_map_back_to_what_the_run_sent() -> None:
    ids = [EID, f"chatcmpl-{SID}-9d8c7b6a", "cmpl-other-0-12345678", "garbage"]
    assert engine_to_server_ids(ids, {SID}) == {EID: SID, f"chatcmpl-{SID}-9d8c7b6a": SID}


def _record(spans: list[list[float]]) -> dict:
    return {"server_id": SID, "stall_spans": spans}


def test_the_steps_inside_a_stall_say_its_cause() -> None:
    start = 100.0
    cases = {
        "preempted": [_decode(101.05, preempted=(EID,)), _decode(101.5, card_s=0.4)],
        "queue": [_decode(101.05, skipped=(EID,)), _decode(101.5, card_s=0.4)],
        "host": [_decode(101.1), _decode(101.9)],  # 40 ms of card in a second's stall
        "prefill": [StepRecord(101.9, 0.85, 9, prefill=12000, recompute=0)],
        "recompute": [StepRecord(101.9, 0.85, 9, prefill=500, recompute=3000)],
        "unknown": [_decode(101.9, card_s=0.9)],
    }
    for cause, steps in cases.items():
        got = truth_causes([_record([[1.0, 2.0]])], steps, start)
        assert got == {SID: [cause]}, cause


def test_a_preemption_just_before_the_last_token_arrived_still_counts() -> None:
    """Async scheduling: the step that preempts ends before the client reads the token the
    step before it made."""
    steps = [_decode(100.9, preempted=(EID,)), _decode(101.5, card_s=0.4)]
    assert truth_causes([_record([[1.0, 2.0]])], steps, 100.0) == {SID: ["preempted"]}
    far = [_decode(100.5, preempted=(EID,)), _decode(101.9, card_s=0.9)]
    assert truth_causes([_record([[1.0, 2.0]])], far, 100.0) == {SID: ["unknown"]}


def test_records_without_a_server_id_or_stalls_are_left_out() -> None:
    recs = [{"server_id": None, "stall_spans": [[1.0, 2.0]]}, {"server_id": SID}]
    assert truth_causes(recs, [_decode(101.5)], 100.0) == {}
