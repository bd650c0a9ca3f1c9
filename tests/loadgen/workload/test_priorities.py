"""Priority classes: parsed as outside input, drawn apart from the prompts, carried in the body,
kept by a session for every turn, and reported per class."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.results.summary import render_classes, summarize_records
from kvwatch.loadgen.workload.lengths import DatasetError
from kvwatch.loadgen.workload.priorities import parse_priorities
from kvwatch.loadgen.workload.sessions import Conversations, SessionShape
from kvwatch.loadgen.workload.spec import WorkItem, WorkloadSpec

_RNG = random.Random(9)
TOKENS = tuple(_RNG.randrange(2, 9000) for _ in range(3000))


def test_classes_and_their_shares() -> None:
    assert parse_priorities("0:0.2, 1:0.8") == ((0, 0.2), (1, 0.8))
    assert parse_priorities("-1:1,5") == ((-1, 1.0), (5, 1.0))


@pytest.mark.parametrize(
    ("spec", "msg"),
    [("high:1", "PRIORITY:SHARE"), ("0:0", "positive"), ("0:inf", "positive"), ("", "one class"),
     ("1:1,1:2", "named twice"), ("0:x", "PRIORITY:SHARE")],
)  # fmt: skip
def test_bad_classes_say_why(spec: str, msg: str) -> None:
    with pytest.raises(DatasetError, match=msg):
        parse_priorities(spec)


def test_classes_are_drawn_apart_from_the_prompts() -> None:
    plain = WorkloadSpec(input_len="20", output_len="5", seed=4, tokens=TOKENS)
    ranked = WorkloadSpec(input_len="20", output_len="5", seed=4, tokens=TOKENS,
                          priorities=((0, 0.25), (1, 0.75)))  # fmt: skip
    a = list(itertools.islice(plain.items(), 400))
    b = list(itertools.islice(ranked.items(), 400))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    counts = Counter(x.priority for x in b)
    assert set(counts) == {0, 1} and 70 <= counts[0] <= 130
    assert b[0].body("m", False, True)["priority"] == b[0].priority
    assert "priority" not in a[0].body("m", False, True)
    assert ranked.describe()["priorities"] == {"0": 0.25, "1": 0.75}


def test_a_class_a_trace_row_carries_is_kept() -> None:
    from kvwatch.loadgen.workload.spec import _with_priorities

    items = iter([WorkItem("", 1, priority=7), WorkItem("", 1)])
    got = list(_with_priorities(items, ((0, 1.0),), 0))
    assert [x.priority for x in got] == [7, 0]


def test_a_session_keeps_its_class() -> None:
    talks = Conversations(SessionShape(), TOKENS, 3, ((0, 1.0), (2, 1.0)))
    prios = [talks.open(n).priority for n in range(40)]
    assert set(prios) == {0, 2}
    assert prios == [Conversations(SessionShape(), TOKENS, 3, ((0, 1.0), (2, 1.0))).open(n).priority
                     for n in range(40)]  # fmt: skip
    assert Conversations(SessionShape(), TOKENS, 3).open(0).priority is None


def test_results_and_stalls_per_class() -> None:
    def rec(i: int, prio: int, stall: bool) -> dict[str, object]:
        gaps = [0.0, 0.01, 0.02, 0.03, 2.0 if stall else 0.04]
        r = RequestRecord(f"s/{i}", 0.0, stage="s", priority=prio, sent_at=0.0,
                          first_token_at=0.1, finished_at=3.0, token_times=[0.1 + g for g in gaps],
                          prompt_tokens=10, output_tokens=5)  # fmt: skip
        return r.to_dict()

    records = [rec(i, i % 2, stall=i % 2 == 1) for i in range(10)]
    s = summarize_records(records)
    assert set(s["classes"]) == {"0", "1"}
    assert s["classes"]["0"]["stalls"] == 0 and s["classes"]["1"]["requests_with_stalls"] == 5
    text = render_classes(s)
    assert text is not None and "priority 0" in text and "priority 1" in text
    unranked = RequestRecord("s/0", 0.0, stage="s", sent_at=0.0, first_token_at=0.1,
                             finished_at=1.0, token_times=[0.1], output_tokens=1)  # fmt: skip
    assert "classes" not in summarize_records([unranked.to_dict()])
    assert render_classes(summarize_records([unranked.to_dict()])) is None
