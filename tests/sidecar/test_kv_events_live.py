"""The sidecar follows the real vLLM's KV events and draws its prefix cache's miss-ratio curve.

The shared server (40 blocks of 32 tokens) publishes its KV events on a Unix socket. Prompts
that share one of eight 6-block documents, each with a question of its own that fills a block,
arrive one at a time in a random order: 48 blocks of documents against 40, so the server evicts
documents that come back (prefix-cache thrash), and a cache twice its size would hold them
all. (A prompt entirely cached stores no block, so vLLM publishes nothing for it: the question's
block is what makes each request seen.) The curve at the server's own size is held to the
hit rate vLLM itself measured over the same requests.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvwatch.loadgen.results.kv_events import KvEventRecorder, curve_from_recording
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe, prefix_cache_counts
from tests.conftest import kv_events_endpoints
from tests.sidecar.running import kvwatch_samples, running_sidecar

pytestmark = pytest.mark.integration

DOCS, DOC_TOKENS, REQUESTS = 8, 192, 56


def _prefix_counters(base: str) -> tuple[float, float]:
    """vLLM's own prefix-cache counters (queries, hits), in tokens."""
    body = httpx.get(base + "/metrics", timeout=30).text
    return prefix_cache_counts(observe(parse_exposition(body)))


def test_the_curve_matches_the_servers_own_hit_rate(vllm_server, tmp_path: Path) -> None:
    base = vllm_server.base_url
    events, replay = kv_events_endpoints(vllm_server.log_path.parent)
    args = ["--target", base, "--interval", "0.5", "--kv-events", events,
            "--kv-events-replay", replay]  # fmt: skip
    rng = random.Random(7)
    recorder = KvEventRecorder(events, replay, tmp_path)  # as `loadgen run --kv-events` does
    with running_sidecar(args) as url, httpx.Client(timeout=60) as client, recorder:
        model = client.get(base + "/v1/models").json()["data"][0]["id"]
        # the model and its engine become known to the sidecar before the load
        client.post(base + "/v1/completions", json={"model": model,
                    "prompt": [5, 6, 7], "max_tokens": 1})  # fmt: skip
        q0, h0 = _prefix_counters(base)
        for i in range(REQUESTS):
            doc = rng.randrange(DOCS)
            prompt = [100 + doc * DOC_TOKENS + j for j in range(DOC_TOKENS)] + [3000 + i] * 40
            r = client.post(base + "/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": 2, "ignore_eos": True,
            })  # fmt: skip
            r.raise_for_status()
        q1, h1 = _prefix_counters(base)
        measured = (h1 - h0) / (q1 - q0)
        for _ in range(40):  # the publisher sends within a step; the sidecar reads in 0.2 s
            state = client.get(url + "/api/state").json()
            curve = state["targets"][0]["prefix_curve"]
            if curve["queries"] >= REQUESTS * 7 and curve["capacity_blocks"]:
                break
            httpx.get(url + "/healthz")  # a pause that waits on the sidecar, not a sleep
        samples = kvwatch_samples(url)
        advice = subprocess.run([sys.executable, "-m", "kvwatch", "advise", "--sidecar", url],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    feed = state["targets"][0]["kv_events"]
    assert feed["batches"] > 0 and feed["missed"] == 0 and feed["refused"] == 0, feed
    assert curve["capacity_blocks"] == 40, curve
    assert curve["source"] == "parent chains"
    by_size = {p["blocks"]: p["hit_ratio"] for p in curve["points"]}
    # vLLM counts tokens (its last partial block and last token always computed), the curve
    # whole blocks, and vLLM's eviction is not exactly LRU; measured here: 55.1% against 54.2%
    assert curve["hit_ratio_now"] == pytest.approx(measured, abs=0.06), (curve, measured)
    assert by_size[80] > curve["hit_ratio_now"] + 0.1  # twice the room holds every document
    assert by_size[80] == pytest.approx(curve["ideal_hit_ratio"], abs=0.05)
    assert curve["restored_blocks"] > 0  # documents evicted and computed again
    assert curve["working_set_blocks"] and 40 < curve["working_set_blocks"] <= 80
    # the dashboard's curve panel groups by these labels (dashboards/build.py KV_EVENT_PANELS)
    sizes = {(s.labels["factor"], s.labels["blocks"])
             for s in samples["kvwatch_prefix_cache_hit_ratio_at_size"]}  # fmt: skip
    assert sizes == {("0.25x", "10"), ("0.5x", "20"), ("1x", "40"), ("2x", "80"), ("4x", "160")}
    assert samples["kvwatch_prefix_cache_ideal_hit_ratio"][0].value == curve["ideal_hit_ratio"]
    assert samples["kvwatch_prefix_cache_restored_blocks_total"][0].value > 0
    # the advice: the memory that holds the documents, from the same curve
    assert "prefix-cache hit rate by size (vLLM's KV events, LRU, parent chains)" in advice.stdout
    assert "prefix cache: --kv-cache-memory-bytes" in advice.stdout, advice.stdout + advice.stderr
    # the same events recorded in a run directory draw the same curve (`advise --run DIR`)
    recorded, notes = curve_from_recording(recorder.path, 40)
    assert recorded is not None and not notes, notes
    assert recorded.points == tuple((p["blocks"], p["hit_ratio"]) for p in curve["points"])
    assert recorder.summary()["missed"] == 0
