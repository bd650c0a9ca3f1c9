"""Stall causes on a recorded twin run, held to its step trace: the burst load of
bench/bench_stall_causes.py (48 requests of 256 + 1,024 tokens at once on Llama 3.1 8B, an H100
with 2 GiB of KV; GPU twin figures), its records cut to what the causes read
(tests/data/stalls/burst-twin.json.gz). The bench's four loads agree on 95-100% of stalls."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

from kvwatch.loadgen.results.stall_causes import ServerCounters, attribute_stalls
from kvwatch.loadgen.results.stall_truth import truth_causes
from kvwatch.loadgen.results.step_trace import StepRecord

DATA = Path(__file__).parents[2] / "data" / "stalls" / "burst-twin.json.gz"


def test_the_recorded_bursts_stalls_get_the_cause_its_steps_show() -> None:
    with gzip.open(DATA, "rt") as f:
        doc = json.load(f)
    steps = sorted((StepRecord.from_json(line) for line in doc["steps"]), key=lambda s: s.end)
    records = doc["records"]
    written = [c for r in records for c in r["stall_causes"]]  # as the load generator wrote them
    attribute_stalls(records, ServerCounters(doc["timeline"]), doc["start_unix"])
    assert [c for r in records for c in r["stall_causes"]] == written
    truth = truth_causes(records, steps, doc["start_unix"])
    pairs = [
        (t, a) for r in records for t, a in zip(truth.get(r["server_id"], []), r["stall_causes"],
                                                strict=True)
    ]  # fmt: skip
    kinds = collections.Counter(t for t, _ in pairs)
    assert len(pairs) >= 50 and {"preempted", "recompute", "prefill"} <= set(kinds), kinds
    agree = sum(t == a for t, a in pairs)
    assert agree >= 0.9 * len(pairs), collections.Counter(pairs)
