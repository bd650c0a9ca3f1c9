"""`kvwatch calibrate` proven without circularity: calibrate on one load, predict others, rerun.

    PYTHONPATH=. .venv/bin/python bench/bench_calibrate.py cpu    # the real vLLM (CPU), ~3 min
    PYTHONPATH=. .venv/bin/python bench/bench_calibrate.py twin   # hidden constants, ~4 min

cpu: a real vLLM on this machine's CPU (the tiny model, 64 MiB of KV) serves the calibration
loads (`loadgen run --sweep concurrency=1,4,16`, 128 + 64 tokens, and 4 streams of 768-token
prompts, which pins the cost of reading the context); `kvwatch calibrate` fits the
step model (the CPU has no data sheet: its bandwidth, FLOP/s and their overlap are fitted too);
then loads it never saw run: 8 and 12 streams, and 4 streams of 384-token prompts. Their TPOT
and output tokens/s (steady state: a closed loop's start wave and drain left out, as the
calibration reads its own) are held against the prediction of `advise --what-if --gpu cpu
--calibration FILE`'s step model.

twin: the twin (Llama 3.1 8B on an H100, 8 GB of KV, time scale 2 so that this machine's
host work hides under the simulated steps) runs with hidden constants, each moved by 40% from
the shipped ones (hbm_efficiency by 20%: +40% would pass the card's ceiling); runs of 1, 8, 32
and 64 streams and one of longer prompts calibrate; the fitted constants are held against
the hidden ones (the pure version: tests/sizing/test_calibration.py).
Results: bench/results/calibrate-{cpu,twin}.json, docs/twin.md.
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


def twin() -> None:
    from kvwatch.twin.serve import start_twin

    base = StepModel(resolve_model("llama-3.1-8b"), lookup_gpu("h100"))
    hidden = {
        "hbm_efficiency": round(base.hbm_efficiency * 1.2, 4),
        "kv_efficiency": round(base.constants.kv_efficiency * 0.6, 4),
        "mfu": round(base.mfu * 0.6, 4),
        "step_overhead_s": round(base.constants.step_overhead_s * 1.4, 7),
    }
    step = [x for k, v in hidden.items() for x in ("--step", f"{k}={v}")]
    work = Path(tempfile.mkdtemp(prefix="kvwatch-calibrate-twin-"))  # kept: the runs to refit
    print(f"  runs in {work}")
    if True:
        server = start_twin(
            "llama-3.1-8b", "h100", work / "vllm.log", time_scale=2.0, status_dir=work,
            step=hidden,
            vllm_args=("--max-model-len", "4096", "--kv-cache-memory-bytes", str(8 * 10**9)),
        )  # fmt: skip
        with server:
            url = server.server.base_url
            runs = []
            loads = [(f"c{c}", ("--concurrency", str(c), "--requests", str(n),
                                "--input-len", "512", "--output-len", "128"))
                     for c, n in ((1, 12), (8, 40), (32, 100), (64, 160))]  # fmt: skip
            loads.append(("long", ("--concurrency", "8", "--requests", "40",
                                   "--input-len", "3072", "--output-len", "128")))  # fmt: skip
            for name, args in loads:
                _load(url, work / name, *args)
                runs += ["--run", str(work / name)]
            p = _kvwatch("calibrate", *runs, "--model", "llama-3.1-8b", "--gpu", "h100",
                         "--json")  # fmt: skip
        if p.returncode != 0:
            raise SystemExit(f"calibrate failed: {p.stderr.strip()}")
    cal = json.loads(p.stdout)
    rows = {
        k: {"hidden": v, "fitted": cal["constants"].get(k),
            "error": None if k not in cal["constants"] else cal["constants"][k] / v - 1}
        for k, v in hidden.items()
    }  # fmt: skip
    for k, r in rows.items():
        err = "not pinned" if r["error"] is None else f"{r['error']:+.1%}"
        print(f"  {k}: hidden {r['hidden']:.4g}, fitted {r['fitted'] or 0:.4g} ({err})")
    print(f"  not pinned: {cal['not_pinned']}; fit error {cal['error']}; {step}")
    out = {"hidden": rows, "calibration": cal, "date": time.strftime("%Y-%m-%d")}
    (RESULTS / "calibrate-twin.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("cpu", "twin"))
    {"cpu": cpu, "twin": twin}[ap.parse_args().what]()


if __name__ == "__main__":
    main()
