"""`kvwatch calibrate` proven without circularity: calibrate on one load, predict others, rerun.

    PYTHONPATH=. .venv/bin/python bench/bench_calibrate.py cpu    # the real vLLM (CPU), ~2 min

cpu: a real vLLM on this machine's CPU (the tiny model, 64 MiB of KV) serves the calibration
loads (`loadgen run --sweep concurrency=1,4,16`, 128 + 64 tokens, and 4 streams of 768-token
prompts, which pins the cost of reading the context); `kvwatch calibrate` fits the
step model (the CPU has no data sheet: its bandwidth, FLOP/s and their overlap are fitted too);
then loads it never saw run: 8 and 12 streams, and 4 streams of 384-token prompts. Their TPOT
and output tokens/s (steady state: a closed loop's start wave and drain left out, as the
calibration reads its own) are held against the prediction of `advise --what-if --gpu cpu
--calibration FILE`'s step model.

(The twin's +-40% recovery is tests/sizing/test_calibration.py, pure: the twin sleeps the
same step model.)
Results: bench/results/calibrate-cpu.json, docs/twin.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvwatch.advise.calibrate import figures_from_run
from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig
from kvwatch.loadgen.tiny_model import build_tiny_model
from kvwatch.sizing.calibration import read_calibration
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.sizing.measured import predict
from kvwatch.sizing.steptime import StepModel

RESULTS = Path(__file__).parent / "results"
PROMPT, OUTPUT = 128, 64
RERUNS = {  # name: (streams, prompt tokens, requests); inside the range calibrated on
    "8 streams": (8, PROMPT, 40),
    "12 streams": (12, PROMPT, 60),
    "4 streams, 384-token prompts": (4, 384, 24),
}


def _kvwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvwatch", *args], capture_output=True,
                          text=True, check=False, timeout=900)  # fmt: skip


def _load(url: str, run_dir: Path, *args: str) -> None:
    t = time.monotonic()
    p = _kvwatch("loadgen", "run", "--url", url, "--run-dir", str(run_dir), *args)
    if p.returncode != 0:
        raise SystemExit(f"load {run_dir.name} failed: {p.stderr.strip()[-300:]}")
    print(f"  {run_dir.name}: {time.monotonic() - t:.0f} s", flush=True)


def prove(
    url: str,
    work: Path,
    model: str,
    gpu: str,
    calib: tuple[tuple[str, ...], ...],
    reruns: dict[str, tuple[int, int, int]],
    output: int,
) -> dict[str, Any]:
    """Calibrate on one load, rerun the others, compare; what the bench and the test share."""
    runs: list[str] = []
    for i, args in enumerate(calib):
        _load(url, work / f"calibration-{i}", *args)
        runs += ["--run", str(work / f"calibration-{i}")]
    cal_file = work / "calibration.json"
    p = _kvwatch("calibrate", *runs, "--model", model, "--gpu", gpu, "--out", str(cal_file))
    if p.returncode != 0:
        raise SystemExit(f"calibrate failed: {p.stderr.strip()}")
    print(p.stdout)
    cal = read_calibration(cal_file)
    steps = StepModel(resolve_model(model), lookup_gpu(gpu), constants=cal.step_constants())
    spec = lookup_gpu(gpu)
    rows = []
    for name, (streams, prompt, requests) in reruns.items():
        d = work / name.replace(" ", "-").replace(",", "")
        _load(url, d, "--concurrency", str(streams), "--requests", str(requests),
              "--input-len", str(prompt), "--output-len", str(output))  # fmt: skip
        figures, _, _ = figures_from_run(d, spec.batched_tokens, 256)
        for f in figures:
            if f.metric == "ttft_s":
                continue  # the proof is TPOT and tokens/s; TTFT is in the calibration's own fit
            pred = predict(steps, f.load, f.metric)
            rows.append({"load": name, "metric": f.metric, "measured": f.value,
                         "predicted": pred, "error": pred / f.value - 1,
                         "outside": cal.outside(streams, prompt, output)})  # fmt: skip
    for r in rows:
        print(f"  {r['load']}: {r['metric']} measured {r['measured']:.4g}, predicted "
              f"{r['predicted']:.4g} ({r['error']:+.1%})")  # fmt: skip
    return {"calibration": cal.to_dict(), "reruns": rows}


def cpu() -> None:
    model = build_tiny_model()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalVLLM(
            ServerConfig(model=model, kv_cache_memory_bytes=64 * 2**20, nice=10),
            log_path=Path(tmp) / "vllm.log",
        ) as server,
    ):
        calib = (
            ("--sweep", "concurrency=1,4,16", "--requests", "48",
             "--input-len", str(PROMPT), "--output-len", str(OUTPUT)),
            ("--concurrency", "4", "--requests", "24", "--input-len", "768",
             "--output-len", str(OUTPUT)),
        )  # fmt: skip
        out = prove(server.base_url, Path(tmp), str(model), "cpu", calib, RERUNS, OUTPUT)
    out["date"] = time.strftime("%Y-%m-%d")
    (RESULTS / "calibrate-cpu.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("cpu",))
    ap.parse_args()
    cpu()


if __name__ == "__main__":
    main()
