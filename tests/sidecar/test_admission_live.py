"""A real vLLM with a queue limit (--max-num-queued-reqs) refuses requests under a spike: its own
`vllm:admission_rejections_total` counts them, the load generator records each refusal, and the
sidecar exports the refusals and shows them in /api/state beside its judgement of the cache
the admitted requests outgrew. `kvwatch advise --prometheus` reads the same count from a real
Prometheus that scraped the server, though the series is born at the first refusal and all came
within one scrape (`increase()` would read 0). (That refusals on a full cache count as waiting
is the detector's unit test: here the admitted eight preempt anyway.) One extra server, about
20 s to start."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from kvwatch.loadgen.results.server_metrics import TimelineRecorder
from kvwatch.local.server import LocalVLLM, ServerConfig
from kvwatch.sidecar.contract.vocabulary import ADMISSION_REJECTIONS, promql_selector
from kvwatch.sidecar.metrics.exposition import parse_exposition
from tests.advise.test_sources import advise
from tests.burst import THRASH_TOKENS
from tests.prometheus import running_prometheus, wait_for_series
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration


def _vllm_rejections(base: str) -> float:
    exp = parse_exposition(httpx.get(base + "/metrics", timeout=10).text)
    return sum(s.value for s in exp.family(ADMISSION_REJECTIONS))


def test_refusals_at_the_queue_limit(tiny_model: Path, tmp_path: Path) -> None:
    cfg = ServerConfig(model=tiny_model, nice=10, extra_args=("--max-num-queued-reqs", "8"))
    with LocalVLLM(cfg, log_path=tmp_path / "vllm.log") as srv:
        base = srv.base_url
        assert _vllm_rejections(base) == 0
        with (
            running_sidecar(["--target", base, "--interval", "0.5", "--db", ""]) as side,
            running_prometheus({"vllm": [base.removeprefix("http://")]}) as prom,
        ):
            wait_for_series(prom, '{__name__=~"vllm[:_]cache_config_info"}')
            # the sidecar's state through the load: after it, hysteresis may have let it go
            with TimelineRecorder(base, sidecar_url=side, period_s=0.5) as during:
                records = loadgen_run_allowing_failures(base, tmp_path / "run")
            refused = [r for r in records if not r["ok"]]
            assert refused, "a 32-request spike into a queue of 8 must be refused in part"
            assert len(refused) < len(records), "the queue admitted nothing"
            # vLLM's count is what the client saw refused
            assert _vllm_rejections(base) == len(refused)
            seen: dict = {}
            states = {r["state"] for r in during.rows}
            # and after it: the preemption counter rises when a victim runs again, and a state
            # is entered once its conditions held enter_after_s
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                state = httpx.get(side + "/api/state", timeout=5).json()
                (engine,) = state["targets"][0]["engines"]
                states.add(engine["state"])
                seen = engine["signals"]
                if seen.get("admission_rejections_long") == len(refused) and states & {
                    "saturated", "thrashing"
                }:  # fmt: skip
                    break
                time.sleep(0.5)
            assert seen["admission_rejections_long"] == len(refused)
            text = httpx.get(side + "/metrics", timeout=5).text
            assert "kvwatch_admission_rejections{" in text
            # 0.32 says where prompt KV came from (prompt_tokens_by_source): the share is read
            # (over the long window: on a slow machine the refusals are counted after the short
            # window has left the load behind, and the short share is rightly None then)
            share = seen["prompt_cache_hit_share_long"]
            assert share is not None and 0 <= share <= 1, seen
            # the 8 admitted requests of 8 blocks each outgrow 39 usable blocks: the cache ran out
            assert states & {"saturated", "thrashing"}, states
            wait_for_series(prom, promql_selector(ADMISSION_REJECTIONS))
            _, (item,) = advise("--prometheus", prom, "--window", "5m", "--step", "1s")
            assert item["observed"]["admission_rejections"] == len(refused), item["observed"]
            assert "refused" in " ".join(item["advice"]["assumptions"]), item["advice"]


def loadgen_run_allowing_failures(base: str, run_dir: Path) -> list[dict]:
    """32 requests at once of 100 + 150 tokens: the queue of 8 refuses most, and the 8 it admits
    (8 blocks each) run the 39 blocks out about 40% of the way in. With the thrashing tests'
    30-token prompts (6 blocks each) they ran out only near the end: on a slow machine the
    preemption counted 1 s before the load ended, and the sidecar judged it after. Refused
    requests fail, so the run exits 1."""
    import json
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(run_dir), "--no-progress", "--stage", "concurrency:n=32#32",
         "--input-len", "100", "--output-len", str(THRASH_TOKENS), "--seed", "13"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stdout + p.stderr
    with (run_dir / "requests.jsonl").open() as fh:
        return [json.loads(line) for line in fh]
