"""The runner: what one request sends under the run's options."""

from __future__ import annotations

from kvwatch.loadgen.send.runner import RunOptions, request_body
from kvwatch.loadgen.workload.spec import WorkItem


def test_kv_report_asks_vllm_for_the_hits() -> None:
    item = WorkItem("hello", 8, 1, (5,))
    plain = request_body(item, RunOptions("http://x", "m"))
    assert "vllm_xargs" not in plain and plain["prompt"] == [5] and plain["ignore_eos"]
    asked = request_body(item, RunOptions("http://x", "m", kv_report=True))
    assert asked["vllm_xargs"] == {"kv_cache_report_mode": "full"}
    assert {k: v for k, v in asked.items() if k != "vllm_xargs"} == plain
