"""Why `calibrate --metrics` misreads a closed loop: where its prefill steps go (issue #40).

A twin (Llama 3.1 8B on an H100, the `bench_calibrate.py twin --constants mirror` constants,
time scale 6) serves 64 streams of 512 + 128 tokens with its step trace on; then the trace's
steps are split into pure decodes of the full batch and steps that carry prompts, and held
against vLLM's own
inter-token latency over the whole run. Streams started together stay in step, so a wave's
prompts are prefilled together at its boundary: slices of the server's counters in mid-wave
hold only decodes, and those across a boundary hold the prefills with fewer requests running.

    PYTHONPATH=. .venv/bin/python bench/bench_itl_waves.py [--save FILE]

Results: docs/twin.md (2026-12-07). About 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from bench_calibrate import hidden_constants

from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.steptime import ScheduledRequest, StepConstants, StepModel
from kvwatch.twin.serve import start_twin

SCALE = 6.0
STREAMS, PROMPT, OUTPUT, REQUESTS = 64, 512, 128, 320


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path)
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvwatch-itl-waves-"))
    try:
        out = _measure(work, hidden_constants("mirror"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=1))
    if ns.save:
        ns.save.write_text(json.dumps(out, indent=1) + "\n")


def _measure(work: Path, hidden: dict[str, float]) -> dict[str, Any]:
    arch, gpu = resolve_model("llama-3.1-8b"), lookup_gpu("h100")
    with start_twin("llama-3.1-8b", "h100", work / "vllm.log", time_scale=SCALE,
                    status_dir=work, step=hidden, step_trace=work / "steps.jsonl",
                    vllm_args=("--max-model-len", "4096",
                               "--kv-cache-memory-bytes", str(8 * 10**9))) as twin:  # fmt: skip
        url = twin.server.base_url
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", url, "--concurrency",
             str(STREAMS), "--requests", str(REQUESTS), "--input-len", str(PROMPT),
             "--output-len", str(OUTPUT), "--no-progress", "--run-dir", str(work / "run")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if p.returncode not in (0, 1):
            raise SystemExit(f"loadgen failed: {p.stderr[-1000:]}")
        (seen,) = observe(parse_exposition(httpx.get(url + "/metrics", timeout=30).text)).values()
    steps = [json.loads(x) for x in (work / "steps.jsonl").read_text().splitlines() if x]
    if not seen.itl_seconds_sum or not seen.itl_count:
        raise SystemExit("the twin exported no inter-token latency")
    itl = seen.itl_seconds_sum / seen.itl_count
    full = [s["card_s"] / SCALE for s in steps if s["prefill"] == 0 and s["requests"] == STREAMS]
    prompts = [s for s in steps if s["prefill"] > 0]
    model = StepModel(arch, gpu, constants=StepConstants.with_overrides(hidden))
    load = Load("fixed_concurrency", STREAMS, PROMPT, OUTPUT, gpu.batched_tokens, 256)
    ctx = PROMPT + OUTPUT // 2
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "hidden": hidden, "time_scale": SCALE,
        "steps": len(steps),
        "full_batch_decode_steps": len(full),
        "full_batch_decode_ms": round(1e3 * statistics.fmean(full), 3),
        "model_decode_ms": round(1e3 * model.seconds([ScheduledRequest(1, ctx)] * STREAMS), 3),
        "prompt_steps": len(prompts),
        "prompt_tokens": sum(s["prefill"] for s in prompts),
        "prompt_step_ms": round(1e3 * statistics.fmean(s["card_s"] / SCALE for s in prompts), 1),
        "prompt_step_requests": sorted(s["requests"] for s in prompts),
        "server_itl_ms_whole_run": round(1e3 * itl / SCALE, 3),
        "model_loop_tpot_ms": round(1e3 * predict(model, load, "tpot_s"), 3),
    }  # fmt: skip
    return out


if __name__ == "__main__":
    main()
