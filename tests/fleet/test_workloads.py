"""The piling workload: round robin over N replicas sends every long conversation's turns to
one of them; the turns of a conversation share its prefix (hash ids) and grow by a turn each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.loadgen.workload.trace import read_trace
from tests.fleet.workloads import PileSpec, session_pile_trace


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_sends_every_long_turn_to_one_replica(tmp_path: Path, replicas: int) -> None:
    spec = PileSpec(replicas=replicas, rate=4, duration_s=30, long_sessions=3)
    n = session_pile_trace(tmp_path / "t.jsonl", spec)
    rows = _rows(tmp_path / "t.jsonl")
    assert n == len(rows) == 120
    by_replica: dict[int, list[int]] = {}
    for i, row in enumerate(rows):  # what a round-robin router starting at 0 does
        by_replica.setdefault(i % replicas, []).append(row["input_tokens"])
    assert min(by_replica[0]) >= spec.long_first_tokens
    assert all(t == spec.short_tokens for k, ts in by_replica.items() if k for t in ts)
    assert [r["t"] for r in rows[:3]] == [0.0, 0.25, 0.5]


def test_a_conversation_resends_its_context_and_grows(tmp_path: Path) -> None:
    spec = PileSpec(replicas=2, rate=2, duration_s=60, long_sessions=2, long_first_tokens=1024,
                    long_turn_tokens=512, long_max_tokens=2048, block_tokens=64)  # fmt: skip
    session_pile_trace(tmp_path / "t.jsonl", spec)
    longs = [r for r in _rows(tmp_path / "t.jsonl") if r["input_tokens"] != spec.short_tokens]
    first, second = longs[0::2], longs[1::2]  # the two conversations' turns, in order
    a0, a1, a2, a3 = (r["hash_ids"] for r in first[:4])
    assert [r["input_tokens"] for r in first[:4]] == [1024, 1536, 2048, 1024]
    assert a1[: len(a0)] == a0 and a2[: len(a1)] == a1
    assert not set(a3) & set(a2)  # past the longest: a new conversation
    assert not set(second[0]["hash_ids"]) & set(a0)
    # kvwatch's own trace reader takes it as it is, every row
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.format == "kvwatch" and len(trace.requests) == 120 and not trace.skipped


def test_a_pile_needs_two_replicas(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        session_pile_trace(tmp_path / "t.jsonl", PileSpec(replicas=1))
