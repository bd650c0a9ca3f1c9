"""How right is the KV-exhaustion forecast? Measured on ramps into preemption on the real fixture.

    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py record [--runs 5]   # about 1 min a run
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py evaluate

`record` starts the fixture vLLM (tiny model, 40 blocks of 32 tokens), and for each run sends a
seeded rate ramp (0.2 to 3 requests/s over 90 s, 30 + 300 tokens) while it scrapes `/metrics`
every 0.5 s, until the cache has run out; each body (the lines the forecast reads) and its time
go to `bench/results/forecast/run-N.jsonl`. `evaluate` replays the bodies through the sidecar's
timeline and asks each forecaster, at every scrape, how many seconds remain until the free
blocks are gone; the truth is the time of the first scrape at which the cache was full (KV usage
100%, or the preemption counter risen: vLLM preempts only when no block is free, and the counter
lags the eviction). The table gives each forecaster's median relative error when the truth was
30, 10 and 5 s away (within +-1.5 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig
from kvwatch.loadgen.tiny_model import build_tiny_model
from kvwatch.sidecar.exposition import parse_exposition
from kvwatch.sidecar.observe import observe
from kvwatch.sidecar.signals import derive
from kvwatch.sidecar.thresholds import Thresholds
from kvwatch.sidecar.timeline import Timeline

OUT = Path(__file__).resolve().parent / "results" / "forecast"
HORIZONS = (30.0, 10.0, 5.0)
TOLERANCE_S = 1.5


def _ramp(base: str, run_dir: Path, seed: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(run_dir), "--no-progress", "--stage", "ramp:start=0.2,end=3@90s",
         "--input-len", "30", "--output-len", "300", "--seed", str(seed)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def record(runs: int, first: int = 0) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    with LocalVLLM(ServerConfig(model=build_tiny_model(), nice=10), log_path=log) as srv:
        for n in range(first, first + runs):
            rows = []
            load = threading.Thread(
                target=_ramp, args=(srv.base_url, Path(tempfile.mkdtemp()), 100 + n)
            )
            t0 = time.monotonic()
            load.start()
            full_at, before = None, None
            with httpx.Client(timeout=30) as client:
                while load.is_alive():
                    try:
                        body = client.get(srv.base_url + "/metrics").text
                    except httpx.HTTPError:  # a starved server answers late: the next one
                        continue
                    t = time.monotonic() - t0
                    rows.append({"t": t, "body": _trim(body)})
                    (obs,) = observe(parse_exposition(body)).values()
                    pre = obs.preemptions_total or 0.0
                    before = pre if before is None else before  # the server's count so far
                    if full_at is None and ((obs.kv_usage or 0) >= 1.0 or pre > before):
                        full_at = t
                    if full_at is not None and t - full_at > 5:
                        break
                    time.sleep(max(0.0, 0.5 - (time.monotonic() - t0 - t)))
            load.join()  # the rest of the ramp drains before the next run starts
            path = OUT / f"run-{n}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(f"run {n}: {len(rows)} scrapes, cache full at {full_at} s -> {path}")


_KEPT = ("vllm:num_requests", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
         "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:cache_config_info")


def _trim(body: str) -> str:
    """The lines the forecast reads (a whole body is 60 KB a scrape)."""
    return "".join(line + "\n" for line in body.splitlines() if line.startswith(_KEPT))


Forecaster = Callable[[Timeline, float], float | None]


def current(tl: Timeline, now: float) -> float | None:
    """kvwatch's signal today: free tokens / generation tokens per second (short window)."""
    s = derive(tl, now, Thresholds())
    return None if s is None else s.seconds_to_exhaustion


def _fit(pts: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares line through the points: (slope, mean time, mean value)."""
    mt = statistics.fmean(t for t, _ in pts)
    mu = statistics.fmean(u for _, u in pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (u - mu) for t, u in pts) / var if var else 0.0
    return slope, mt, mu


def usage_slope(window_s: float) -> Forecaster:
    """Free blocks over the rate the used blocks grew at: the least-squares slope of KV usage
    over the window (admissions, growth and completions all in it)."""

    def forecast(tl: Timeline, now: float) -> float | None:
        pts = [
            (t, o.kv_usage) for t, o in tl.points if t >= now - window_s and o.kv_usage is not None
        ]
        if len(pts) < 3:
            return None
        slope, _, _ = _fit(pts)
        if slope <= 0:
            return None
        return max(0.0, 1.0 - pts[-1][1]) / slope

    return forecast


def peak_slope(window_s: float, bin_s: float = 5.0) -> Forecaster:
    """The trend of the usage's peaks: usage swings as requests finish, and the cache runs out
    at a peak. The highest usage in each bin, fitted over the window; the time until the
    fitted peak line reaches 100%."""

    def forecast(tl: Timeline, now: float) -> float | None:
        bins: dict[int, float] = {}
        for t, o in tl.points:
            if t >= now - window_s and o.kv_usage is not None:
                k = int((now - t) // bin_s)
                bins[k] = max(bins.get(k, 0.0), o.kv_usage)
        if len(bins) < 3:
            return None
        pts = [(now - (k + 0.5) * bin_s, u) for k, u in bins.items()]
        slope, mt, mu = _fit(pts)
        if slope <= 0:
            return None
        at_now = mu + slope * (now - mt)
        return max(0.0, 1.0 - at_now) / slope

    return forecast


FORECASTERS: dict[str, Forecaster] = {
    "free tokens / generation rate (current)": current,
    "KV usage slope, 5 s": usage_slope(5.0),
    "KV usage slope, 10 s": usage_slope(10.0),
    "KV usage slope, 20 s": usage_slope(20.0),
    "peaks of KV usage (5 s bins), 30 s": peak_slope(30.0),
    "peaks of KV usage (5 s bins), 60 s": peak_slope(60.0),
}


def evaluate() -> None:
    errors: dict[str, dict[float, list[float]]] = {
        name: {h: [] for h in HORIZONS} for name in FORECASTERS
    }
    runs = sorted(OUT.glob("run-*.jsonl"))
    for path in runs:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        obs = [(r["t"], next(iter(observe(parse_exposition(r["body"])).values()))) for r in rows]
        before = obs[0][1].preemptions_total or 0.0  # earlier runs' preemptions
        full_at = next(
            (t for t, o in obs
             if (o.kv_usage or 0) >= 1.0 or (o.preemptions_total or 0) > before),
            None,
        )  # fmt: skip
        if full_at is None:
            print(f"{path.name}: the cache never ran out; skipped")
            continue
        tl = Timeline()
        for t, o in obs:
            if t > full_at:
                break
            tl.add(t, o)
            remaining = full_at - t
            for h in HORIZONS:
                if abs(remaining - h) <= TOLERANCE_S and remaining > 0:
                    for name, f in FORECASTERS.items():
                        got = f(tl, t)
                        err = 1.0 if got is None else abs(got - remaining) / remaining
                        errors[name][h].append(err)
    print(f"{len(runs)} runs; median relative error (None counts as 100%) at the truth's distance:")
    print("| forecaster | " + " | ".join(f"{h:g} s out" for h in HORIZONS) + " |")
    print("|---|" + "---|" * len(HORIZONS))
    for name, by_h in errors.items():
        cells = [f"{statistics.median(v):.0%} (n={len(v)})" if v else "-" for v in by_h.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--first", type=int, default=0, help="number of the first run (its seed)")
    sub.add_parser("evaluate")
    ns = ap.parse_args()
    if ns.cmd == "record":
        record(ns.runs, ns.first)
    else:
        evaluate()


if __name__ == "__main__":
    main()
