"""How right is the KV-exhaustion forecast, and does its alert come first? Measured on the fixture.

    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py record [--runs 5] [--first N]
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py record --poisson-ramp [--runs 5]
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py record --steady 1.0 [--runs 3]
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py record --steady-in-flight 2 --idle 3 \
        --prefix steadyn [--runs 3] [--cpu-hog] [--throttle CORES]
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py evaluate [--threshold NAME=VALUE ...]
    PYTHONPATH=. .venv/bin/python bench/bench_forecast.py summary llama8b qwen3moe \
        [--after {rise,usage-check,moe-bend,bic}] [--threshold NAME=VALUE ...]

`record` starts the fixture vLLM (tiny model, 40 blocks of 32 tokens), and for each run sends a
rate ramp (0.2 to 3 requests/s over 90 s, 30 + 300 tokens) while it scrapes `/metrics` every
0.5 s, until the cache has run out; each body (the lines the forecasts read) and its time go to
`bench/results/forecast/run-N.jsonl` (about 2 min a run). loadgen's ramp spaces its sends evenly
by the rate's integral, so every run sends the same; what differs between runs is the server's
speed. `--poisson-ramp` sends the same rate as a Poisson process, seeded by the run's number
(`poisson-N.jsonl`): the clusters real traffic has. With `--steady RATE` a run is 90 s of
arrivals at that rate instead (a busy load, healthy if it never runs out), `steady-N.jsonl`;
`--steady-in-flight N` paces it as the live test does, to keep N requests running on average
(Little's law, with the time ceil(N) take together, measured before each run). `--idle S`
scrapes S seconds of idle first, as the live tests' sidecar sees them (t = 0 stays the load's
start).
The server runs at nice 10, behind the load generator and the scraper; `--nice 0 --prefix nice0`
records even ramps with it at their priority (`nice0-N.jsonl`), and
`--steady ... --nice 0 --prefix steady0` steady runs so (`steady0-N.jsonl`). The recordings
`run-N`, `poisson-N`, `nice0-N`, `steady-N` and `steady0-N` were made before LocalVLLM niced the
server's session (autogroups), so the nice value had no effect on them (docs/detection.md);
`--prefix niced` (even ramps), `steadyn`, `steadyf` and `steadyh` (steady loads of 2 and 3 in
flight, the last beside a CPU hog), `steadys`, `steadyt` and `steadyu` (2 in flight, then the
server throttled: `--throttle`) were recorded with it niced.

`evaluate` replays the bodies through the sidecar's own judge (sidecar/judge/pipeline.py) and asks
each forecaster, at every scrape, how many seconds remain until the free blocks are gone; the
truth is the time of the first scrape at which the cache was full (KV usage 100%, or the
preemption counter risen: vLLM preempts only when no block is free, and the counter lags the
eviction). The first tables give each forecaster's median relative error when the truth was
30, 10 and 5 s away (within +-1.5 s): on the even ramps the sidecar's window and lift were
chosen on (0-3), on those recorded after the choice, and on each held-out batch (HELD_OUT:
Poisson, nice 0, niced). Then
KvwatchKvExhaustionImminent's lead time on each ramp, and the times it fired on the steady runs
(on a run that never ran out, a false alert), at the recorded 0.5 s and at the sidecar's
default 1 s interval (every other scrape). `--threshold exhaustion_countdown_s=0` judges the
alert without its countdown, as it was before; `--threshold exhaustion_refuted_factor=0`
without its check on past forecasts.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fixture_sim import FIXTURE, Engine, Shape, Speeds, run_until_out
from procfs import session_pids
from twins import twin_from_spec

from kvwatch.local.server import LocalVLLM, ServerConfig, set_autogroup_nice, stop_process
from kvwatch.local.tiny_model import build_tiny_model
from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds, parse_overrides
from kvwatch.sidecar.judge.forecast import (
    MIN_POINTS,
    WINDOW_S,
    forecast_exhaustion,
    line_fit,
    quadratic_fit,
)
from kvwatch.sidecar.judge.pipeline import EngineJudge
from kvwatch.sidecar.judge.signals import derive
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import EngineObservation, observe
from kvwatch.sizing.archconfig import Architecture
from kvwatch.sizing.kvmath import resolve_model
from tests.burst import rate_for_in_flight
from tests.twin.seed import VICTIM_LINE

OUT = Path(__file__).resolve().parent / "results" / "forecast"
HORIZONS = (30.0, 10.0, 5.0)
TOLERANCE_S = 1.5
TUNED_ON = 4  # runs 0-3: the forecast's window and lift were chosen on these
RAMP = "ramp:start=0.2,end=3@90s"  # evenly spaced sends, the same in every run
POISSON_RAMP = "ramp:start=0.2,end=3,poisson=1@90s"  # the same rate, Poisson arrivals (seeded)
# ramps recorded after every choice: (file prefix, what they are)
HELD_OUT = (
    ("poisson", "Poisson ramps"),
    ("nice0", "even ramps, the server at nice 0 (its session unniced)"),
    ("niced", "even ramps, the server's session niced (LocalVLLM since 7dc659b)"),
)


def _load(
    base: str,
    run_dir: Path,
    seed: int,
    stage: str,
    lengths: tuple[int, int],
    trace: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> None:
    """`trace`: loadgen's trace arguments, sent instead of the stage and lengths; `extra`:
    more of loadgen's arguments (`--sessions --turns 4 ...`), sent with the stage."""
    load = trace or (
        "--stage",
        stage,
        "--input-len",
        str(lengths[0]),
        "--output-len",
        str(lengths[1]),
        *extra,
    )
    subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(run_dir), "--no-progress", *load, "--seed", str(seed)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """What `record` sends each run: a loadgen stage (None: a steady load that keeps
    `in_flight` requests running, paced before each run as the live test paces its steady
    load), the files' prefix, the server's nice value, and the idle seconds scraped before
    the load starts (the live tests' sidecar sees 3 s of idle first). `cpu_hog`: a busy loop
    per CPU shares them with the server at its priority throughout (a slower, contended
    machine). `throttle`: the server may use this many cores while the load runs (a cgroup
    quota), after a steady load was paced at its full speed: a server that slows under the
    arrivals it was sized for."""

    stage: str | None
    prefix: str
    nice: int = 10
    in_flight: float = 2.0
    idle_s: float = 0.0
    cpu_hog: bool = False
    throttle: float | None = None
    # MODEL:GPU:KV_BYTES: the GPU twin (vLLM's engine on a simulated card, time scale 1) instead
    # of the fixture, with prompts and outputs of `lengths` tokens
    twin: str | None = None
    lengths: tuple[int, int] = (30, 300)
    # a ramp is scraped this long after the cache ran out (the twin's: long enough for the
    # thrashing state to be judged)
    after_full_s: float = 5.0
    # loadgen's trace arguments (`--trace FILE --trace-speed X --trace-speed-end Y ...`): a
    # recorded trace replayed instead of the stage, judged as a ramp when its speed rises
    trace: tuple[str, ...] = ()
    # more of loadgen's arguments sent with the stage, e.g. multi-turn sessions
    # (`--sessions --turns 4 --turn-input-len 200`: the stage's rate is then sessions a second)
    extra: tuple[str, ...] = ()


@contextmanager
def _server(recipe: Recipe) -> Iterator[tuple[str, int, Path]]:
    """The fixture vLLM, or the twin: its base URL, the pid that leads its session, its log."""
    with tempfile.TemporaryDirectory(prefix="kvwatch-bench-forecast-") as tmp:
        log = Path(tmp) / "vllm.log"
        if recipe.twin is None:
            with LocalVLLM(ServerConfig(model=build_tiny_model(), nice=recipe.nice), log) as srv:
                yield srv.base_url, srv.pid, log
        else:
            with twin_from_spec(recipe.twin, log) as twin:
                print(f"twin: {twin.capacity_line()}")
                yield twin.base_url, twin.server.pid, log


def record(recipe: Recipe, runs: int, first: int = 0) -> None:
    """Each run until the cache has run out (a ramp) or to its end (a steady load)."""
    OUT.mkdir(parents=True, exist_ok=True)
    with (
        _server(recipe) as (base, pid, log),
        _cpu_hog(recipe.nice if recipe.cpu_hog else None),
        _cpu_quota(pid if recipe.throttle else None) as quota,
    ):
        seen = 0
        for n in range(first, first + runs):
            stage = recipe.stage
            if stage is None:
                rate, _ = asyncio.run(rate_for_in_flight(base, recipe.in_flight, seed=100 + n))
                stage = f"constant:rate={rate:.3f}@90s"
            quota(recipe.throttle)
            if recipe.trace:
                stage = "ramp trace " + " ".join(recipe.trace)
            try:
                rows, full_at = _record_run(
                    base,
                    stage,
                    recipe.idle_s,
                    100 + n,
                    recipe.lengths,
                    recipe.after_full_s,
                    recipe.trace,
                    recipe.extra,
                )
            finally:
                quota(None)
            rows[0]["stage"] = " ".join((stage, *recipe.extra))
            rows[0]["throttle"] = recipe.throttle
            rows[0]["twin"] = recipe.twin
            rows[0]["lengths"] = recipe.lengths
            if recipe.twin is not None:  # the twin's log names each victim; since the last run
                victims = VICTIM_LINE.findall(log.read_text(errors="replace"))
                rows[0]["victims"] = victims[seen:]
                seen = len(victims)
            path = OUT / f"{recipe.prefix}-{n}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(f"run {n} ({stage}): {len(rows)} scrapes, cache full at {full_at} s -> {path}")


@contextmanager
def _cpu_hog(nice: int | None) -> Iterator[None]:
    """A busy loop per CPU, each in a session of its own at `nice` (its session too, as
    LocalVLLM nices the server's). Measured, it slowed the server's requests by about 5% only:
    `--throttle` slows it for sure. Stopped on exit; nothing where `nice` is None."""
    if nice is None:
        yield
        return
    hogs = []
    try:
        for _ in range(os.cpu_count() or 1):
            hog = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], start_new_session=True,
                preexec_fn=lambda: os.nice(nice),
            )  # fmt: skip
            hogs.append(hog)
            set_autogroup_nice(hog.pid, nice)
        yield
    finally:
        for hog in hogs:
            stop_process(hog)


_CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller


@contextmanager
def _cpu_quota(session: int | None) -> Iterator[Callable[[float | None], None]]:
    """A cpu cgroup holding the processes of the server's session (it leads one); yields a
    setter of their quota in cores (None: unlimited). The processes go back to the root group
    and the group is removed on exit. Nothing where `session` is None."""
    if session is None:
        yield lambda cores: None
        return
    if not (_CPU_CGROUP / "cgroup.procs").is_file():
        raise SystemExit(f"--throttle needs cgroup v1's cpu controller at {_CPU_CGROUP} (as root)")
    group = _CPU_CGROUP / f"kvwatch-bench-{os.getpid()}"
    group.mkdir()
    period = int((group / "cpu.cfs_period_us").read_text())

    def move(to: Path) -> None:
        for pid in session_pids(session):
            with suppress(OSError):  # it ended meanwhile
                (to / "cgroup.procs").write_text(str(pid))

    def quota(cores: float | None) -> None:
        value = -1 if cores is None else max(1000, int(cores * period))
        (group / "cpu.cfs_quota_us").write_text(str(value))

    try:
        move(group)
        yield quota
    finally:
        quota(None)
        move(_CPU_CGROUP)
        group.rmdir()


def _record_run(
    base: str,
    stage: str,
    idle_s: float,
    seed: int,
    lengths: tuple[int, int],
    after_s: float,
    trace: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> tuple[list[dict], float | None]:
    """Scrape every 0.5 s, `idle_s` before the load starts (t = 0) and until it ends or, on a
    ramp, `after_s` after the cache ran out: the rows, and when it ran out."""
    run_dir = Path(tempfile.mkdtemp())
    load = threading.Thread(target=_load, args=(base, run_dir, seed, stage, lengths, trace, extra))
    t0 = time.monotonic() + idle_s
    rows: list[dict] = []
    full_at, before = None, None
    with httpx.Client(timeout=30) as client:
        while load.ident is None or load.is_alive():
            try:
                body = client.get(base + "/metrics").text
            except httpx.HTTPError:  # a starved server answers late: the next one
                continue
            t = time.monotonic() - t0
            rows.append({"t": t, "body": _trim(body)})
            (obs,) = observe(parse_exposition(body)).values()
            pre = obs.preemptions_total or 0.0
            before = pre if before is None else before  # the server's count so far
            if full_at is None and ((obs.kv_usage or 0) >= 1.0 or pre > before):
                full_at = t
            if stage.startswith("ramp") and full_at is not None and t - full_at > after_s:
                break
            if t >= 0 and load.ident is None:
                load.start()
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t0 - t)))
    load.join()  # the rest of the ramp drains before the next run starts
    shutil.rmtree(run_dir, ignore_errors=True)
    return rows, full_at


_KEPT = (
    "vllm:num_requests",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:cache_config_info",
    # kept since steady-6 (not in run-0..13): what finished, the requests' shape and lifetime
    "vllm:request_success_total",
    "vllm:request_num_preemptions",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_sum",
    "vllm:request_generation_tokens_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    # the twin's card: time it waited on this machine's CPU (its figures hold while this is ~0)
    "kvwatch_twin_simulated_seconds_total",
    "kvwatch_twin_behind_seconds_total",
)


def _trim(body: str) -> str:
    """The lines the forecast reads (a whole body is 60 KB a scrape)."""
    return "".join(line + "\n" for line in body.splitlines() if line.startswith(_KEPT))


Forecaster = Callable[[Timeline, float], float | None]


def before(tl: Timeline, now: float) -> float | None:
    """kvwatch's signal until #17: free tokens / generation tokens per second (short window),
    as if nothing finished."""
    s = derive(tl, now, Thresholds())
    if s is None or s.free_tokens is None or not s.generation_tokens_per_s:
        return None
    return s.free_tokens / s.generation_tokens_per_s


def sidecar(tl: Timeline, now: float, routed_share: float = 0.0) -> float | None:
    """kvwatch's signal now (sidecar/judge/signals.py's exhaustion_seconds): the usage curve
    where it fits, else the earlier of the load's forecast and the line's band. `routed_share`:
    the served model's, as a sidecar told its `--model` reads it."""
    s = derive(tl, now, Thresholds(), routed_share=routed_share)
    return None if s is None else s.seconds_to_exhaustion


def usage_band(tl: Timeline, now: float) -> float | None:
    """kvwatch's signal from #29 to #44 (sidecar/judge/forecast.py alone): the band of KV
    usage's peaks, or the curve where it fits."""
    pts = [(t, o.kv_usage) for t, o in tl.window(WINDOW_S, now) if o.kv_usage is not None]
    got = forecast_exhaustion(pts, now)
    return None if got is None else got.seconds


def usage_slope(window_s: float) -> Forecaster:
    """Free blocks over the rate the used blocks grew at: the least-squares slope of KV usage
    over the window (admissions, growth and completions all in it)."""

    def forecast(tl: Timeline, now: float) -> float | None:
        pts = [
            (t, o.kv_usage) for t, o in tl.points if t >= now - window_s and o.kv_usage is not None
        ]
        if len(pts) < 3:
            return None
        slope, _, _ = line_fit(pts)
        if slope <= 0:
            return None
        return max(0.0, 1.0 - pts[-1][1]) / slope

    return forecast


def usage_curve(window_s: float) -> Forecaster:
    """A quadratic through KV usage over the window, run forward to 100%: a rise that
    accelerates (a ramp on a big cache, where usage is smooth) bends the line up. Tried at
    H100 scale (docs/detection.md); not the sidecar's."""

    def forecast(tl: Timeline, now: float) -> float | None:
        pts = [
            (t - now, o.kv_usage)
            for t, o in tl.points
            if t >= now - window_s and o.kv_usage is not None
        ]
        if len(pts) < MIN_POINTS:
            return None
        fit = quadratic_fit(pts)  # the sidecar's, without its gate
        if fit is None:
            return None
        a, b, c = fit
        if c <= 0 and b <= 0:
            return None
        if c == 0:
            return max(0.0, (1.0 - a) / b)
        disc = b * b + 4 * c * (1.0 - a)
        roots = [] if disc < 0 else [(-b + sign * math.sqrt(disc)) / (2 * c) for sign in (1, -1)]
        ahead = [r for r in roots if r >= 0]
        return min(ahead) if ahead else None

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
        slope, mt, mu = line_fit(pts)
        if slope <= 0:
            return None
        at_now = mu + slope * (now - mt)
        return max(0.0, 1.0 - at_now) / slope

    return forecast


def _admissions(
    pts: list[tuple[float, EngineObservation]], now: float, prompt: int
) -> tuple[float, float]:
    """The admission rate now and its slope (requests/s, /s^2): a parabola through the prompt
    tokens counter, over the prompt length."""
    x = np.array([t - now for t, _ in pts])
    y = np.array([(o.prompt_tokens_total or 0.0) / prompt for _, o in pts])
    _, b, c = np.linalg.lstsq(np.vstack([np.ones_like(x), x, x * x]).T, y, rcond=None)[0]
    return float(b), float(2 * c)


def engine_model(
    told: Shape = FIXTURE, window_s: float = 60.0, speed_s: float = 10.0
) -> Forecaster:
    """Simulates the engine forward (bench/fixture_sim.py) from what /metrics says: the cache's
    blocks, the running requests, the step time (running / generation tokens per second over
    `speed_s`), the admission rate and its trend. Told the requests' prompt and output lengths
    (a sidecar would read them from vLLM's request_prompt_tokens and request_generation_tokens
    histograms). The running requests' lengths are not in /metrics: they are taken as admitted
    at the rate, at the phase whose blocks best match the KV usage."""

    def forecast(tl: Timeline, now: float) -> float | None:
        pts = [
            (t, o)
            for t, o in tl.points
            if t >= now - window_s and o.prompt_tokens_total is not None
        ]
        if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < 10:
            return None
        last = pts[-1][1]
        cache = last.cache
        if cache is None or not cache.num_blocks or not cache.block_size or last.kv_usage is None:
            return None
        sh = Shape(int(cache.num_blocks) - 1, int(cache.block_size), told.prompt, told.output)
        rate, slope = _admissions(pts, now, sh.prompt)
        recent = [(t, o) for t, o in pts if t >= now - speed_s]
        (t0, a), (t1, b) = recent[0], recent[-1]
        gen = ((b.generation_tokens_total or 0) - (a.generation_tokens_total or 0)) / max(
            t1 - t0, 1e-9
        )
        running = statistics.fmean(o.running or 0.0 for _, o in recent)
        if rate <= 0 or gen <= 0 or running <= 0:
            return None
        step, slope = running / gen, max(slope, 0.0)
        used, n = last.kv_usage * sh.blocks, round(last.running or 0)

        def lengths(phase: float) -> list[int]:
            return [
                min(sh.prompt + int((k + phase) / rate / step), sh.prompt + sh.output - 1)
                for k in range(n)
            ]

        phase = min(
            (i / 8 for i in range(8)),
            key=lambda ph: abs(sum(map(sh.blocks_for, lengths(ph))) - used),
        )
        sends, k = [], 1.0 - phase  # the k-th send when the rate's integral reaches k - phase
        while True:
            t = k / rate if slope == 0 else (-rate + math.sqrt(rate * rate + 2 * slope * k)) / slope
            if t > 120.0:
                break
            sends.append(t)
            k += 1
        engine = Engine(sh, 0.0, lengths(phase), 0, sends, 0, step, step, math.inf)
        out = run_until_out(engine, random.Random(0), Speeds([step], [0.0]), until=120.0)
        return None if out >= 120.0 else out

    return forecast


def load_model(tl: Timeline, now: float) -> float | None:
    """The load's own forecast alone (sidecar/judge/load_forecast.py: admissions x residence
    x blocks a request holds, against the cache)."""
    s = derive(tl, now, Thresholds())
    return None if s is None else s.seconds_to_exhaustion_load


FORECASTERS: dict[str, Forecaster] = {
    "free tokens / generation rate (before #17)": before,
    "KV usage slope, 10 s": usage_slope(10.0),
    "KV usage slope, 20 s": usage_slope(20.0),
    "peaks of KV usage (5 s bins), 60 s": peak_slope(60.0),
    "band of a 60 s line, or of a 30 s curve (the sidecar's, #29 to #44)": usage_band,
    "a simulation of the engine, told the request shape": engine_model(),
    "quadratic through KV usage, 30 s (tried at H100 scale)": usage_curve(30.0),
    "the load alone: admissions x residence x blocks a request holds": load_model,
    "the sidecar's (since #44): the curve where it fits, else the earlier of the load and the "
    "band": sidecar,
}


Run = list[tuple[float, EngineObservation]]
Errors = dict[str, dict[float, list[float]]]  # forecaster -> horizon -> relative errors


def _load_run(path: Path) -> Run:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["t"], next(iter(observe(parse_exposition(r["body"])).values()))) for r in rows]


def _header(path: Path) -> dict[str, Any]:
    """A recording's first row: its stage, its twin (if any) and the victims, with its body."""
    with path.open() as f:
        row: dict[str, Any] = json.loads(f.readline())
    return row


def _model(path: Path) -> Architecture | None:
    """The twin's served model, as its sidecar's `--model` gives it (a twin's recording names
    its twin in its first row; the fixture's give none: the sidecar reads it as unknown)."""
    spec = _header(path).get("twin")
    return None if not spec else resolve_model(spec.partition(":")[0])


def _full_at(run: Run) -> float | None:
    """The first scrape at which the cache was full: usage 100% or the counter risen."""
    before = run[0][1].preemptions_total or 0.0  # earlier runs' preemptions
    return next(
        (t for t, o in run if (o.kv_usage or 0) >= 1.0 or (o.preemptions_total or 0) > before),
        None,
    )


def _errors(run: Run, full_at: float, model: Architecture | None = None) -> Errors:
    """Each forecaster's relative errors at the scrapes the truth was a horizon away from;
    the sidecar's told the served `model` as its `--model` would."""
    share = 0.0 if model is None else model.moe_routed_share
    told = {**FORECASTERS, SIDECAR: functools.partial(sidecar, routed_share=share)}
    out: Errors = {n: {h: [] for h in HORIZONS} for n in told}
    tl = Timeline()
    for t, o in run:
        if t > full_at:
            break
        tl.add(t, o)
        remaining = full_at - t
        for h in HORIZONS:
            if abs(remaining - h) <= TOLERANCE_S and remaining > 0:
                for name, f in told.items():
                    got = f(tl, t)
                    err = 1.0 if got is None else abs(got - remaining) / remaining
                    out[name][h].append(err)
    return out


def firings(
    run: Run, every: int = 1, th: Thresholds | None = None, model: Architecture | None = None
) -> list[float]:
    """When KvwatchKvExhaustionImminent would have fired (its condition lasted its `for`),
    replaying the scrapes (every `every`-th) through the sidecar's own judge, told the served
    `model` as its `--model` would."""
    th = th or Thresholds()
    judge = EngineJudge("bench", ("model", "0"), th, 0, model)
    fired: list[float] = []
    since_fired: float | None = None
    for t, o in run[::every]:
        judge.observe(t, t, o, None)
        since = judge.exhaustion_imminent_since
        if since is not None and t - since >= th.exhaustion_for_s and since != since_fired:
            fired.append(t)
            since_fired = since
    return fired


def _table(title: str, errors: list[Errors]) -> None:
    print(f"\n{title}: median relative error (None counts as 100%) at the truth's distance")
    print("| forecaster | " + " | ".join(f"{h:g} s out" for h in HORIZONS) + " |")
    print("|---|" + "---|" * len(HORIZONS))
    for name in FORECASTERS:
        cells = []
        for h in HORIZONS:
            v = [e for run in errors for e in run[name][h]]
            cells.append(f"{statistics.median(v):.0%} (n={len(v)})" if v else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")


def _number(path: Path) -> int:
    """A recording's run number: the N of `NAME-N.jsonl`."""
    return int(path.stem.rpartition("-")[2])


def _numbered(prefix: str, skip: range = range(0)) -> list[Path]:
    """`prefix` may be a glob: the files by prefix, then by number; those numbered in `skip`
    left out."""
    paths = [p for p in OUT.glob(f"{prefix}-*.jsonl") if _number(p) not in skip]
    return sorted(paths, key=lambda p: (p.stem.rpartition("-")[0], _number(p)))


def _ramps(
    prefix: str, th: Thresholds, skip: range = range(0)
) -> list[tuple[int, Errors, dict[int, float]]]:
    """Each ramp that ran out (those numbered in `skip` left out): its number, the forecasters'
    errors, and the alert's lead time at 0.5 s (every scrape) and 1 s (every other), -1 where
    it did not fire first."""
    out = []
    for path in _numbered(prefix, skip):
        run, model = _load_run(path), _model(path)
        full_at = _full_at(run)
        if full_at is None:
            print(f"{path.name}: the cache never ran out; skipped")
            continue
        leads = {}
        for every in (1, 2):
            first = next(iter(firings([p for p in run if p[0] <= full_at], every, th, model)), None)
            leads[every] = -1.0 if first is None else full_at - first
        print(f"{path.name}: full at {full_at:.1f} s; alert lead {leads[1]:.1f} s "
              f"(0.5 s scrapes), {leads[2]:.1f} s (1 s)")  # fmt: skip
        out.append((_number(path), _errors(run, full_at, model), leads))
    return out


def _leads(title: str, ramps: list[tuple[int, Errors, dict[int, float]]]) -> None:
    print(f"\nKvwatchKvExhaustionImminent, {title} (-1: it did not fire before the cache ran out)")
    for every, name in ((1, "0.5 s"), (2, "1 s")):
        got = [leads[every] for _, _, leads in ramps]
        if got:
            missed = sum(1 for x in got if x < 0)
            print(
                f"- {name} scrapes: lead times {[round(x, 1) for x in got]}, "
                f"median {statistics.median(got):.1f} s, missed {missed} of {len(got)}"
            )


def evaluate(th: Thresholds) -> None:
    """`th`: the thresholds the alert is judged with (the sidecar's defaults, or a variant)."""
    even = _ramps("run", th)
    _table(
        f"even ramps 0-{TUNED_ON - 1} (the window and lift were chosen on these)",
        [e for n, e, _ in even if n < TUNED_ON],
    )
    _table(
        f"even ramps {TUNED_ON}+ (recorded after the choice)",
        [e for n, e, _ in even if n >= TUNED_ON],
    )
    _leads("even ramps", even)
    for prefix, title in HELD_OUT:
        ramps = _ramps(prefix, th)
        if ramps:
            _table(f"{title} (`{prefix}-N`)", [e for _, e, _ in ramps])
            _leads(title, ramps)
    _steady("steady*", th)  # steady-N, steady0-N, any steady prefix


def _steady(pattern: str, th: Thresholds, skip: range = range(0)) -> None:
    """The alert's firings on steady runs (those numbered in `skip` left out): a false alert
    is one on a run that never ran out."""
    print("\nSteady runs (a false alert: one that fired on a run whose cache never ran out)")
    healthy = false = 0
    for path in _numbered(pattern, skip):
        stage = _header(path).get("stage", "?")
        run, model = _load_run(path), _model(path)
        full_at = _full_at(run)
        peak = max((o.kv_usage or 0) for _, o in run)
        fired = {every: firings(run, every, th, model) for every in (1, 2)}
        ran_out = "never ran out" if full_at is None else f"ran out at {full_at:.0f} s"
        if full_at is None:
            healthy += 1
            false += len(fired[1]) + len(fired[2])
        print(
            f"- {path.name} ({stage}): {run[-1][0]:.0f} s, peak KV {peak:.0%}, {ran_out}; "
            f"fired at {[round(t) for t in fired[1]]} s (0.5 s scrapes), "
            f"{[round(t) for t in fired[2]]} s (1 s)"
        )
    print(f"false alerts on {healthy} healthy steady runs, both intervals together: {false}")


def _states(run: Run, th: Thresholds) -> dict[str, float | None]:
    """When the judge first called the engine saturated and thrashing, replaying every scrape,
    beside the first preemption (the counter's first rise)."""
    judge = EngineJudge("bench", ("model", "0"), th, 0)
    before = run[0][1].preemptions_total or 0.0
    first: dict[str, float | None] = {"preemption": None, "saturated": None, "thrashing": None}
    for t, o in run:
        judge.observe(t, t, o, None)
        if first["preemption"] is None and (o.preemptions_total or 0) > before:
            first["preemption"] = t
        for level in (Level.SATURATED, Level.THRASHING):
            if judge.level >= level and first[level.label] is None:
                first[level.label] = t
    return first


def evaluate_twin(name: str, th: Thresholds) -> None:
    """The twin's recordings `twin-NAME-ramp-N`, `-poisson-N`, `-bursty-N` and `-steady-N`
    (recorded after the sidecar's thresholds were chosen on the fixture), judged as `evaluate`
    judges the fixture's, plus the states' timing and the victims the twin's log named. Which
    runs chose #44's countdown and which are held out: docs/detection.md."""
    kinds = (("ramp", "even ramps"), ("poisson", "Poisson ramps"),
             ("bursty", "bursty ramps (gamma gaps, cv 2; held out)"),
             ("trace", "traces replayed at a rising speed (held out)"),
             ("sessions", "multi-turn sessions growing in number (held out)"))  # fmt: skip
    for kind, title in kinds:
        ramps = _ramps(f"twin-{name}-{kind}", th)
        if not ramps:
            continue
        _table(f"twin {name}, {title}", [e for _, e, _ in ramps])
        _leads(f"twin {name}, {title}", ramps)
        print("\n| run | first preemption | saturated | thrashing | thrashing after it |")
        print("|---|---|---|---|---|")
        for path in _numbered(f"twin-{name}-{kind}"):
            st = _states(_load_run(path), th)
            p, x = st["preemption"], st["thrashing"]
            cells = ["-" if v is None else f"{v:.1f} s" for v in st.values()]
            lag = "-" if p is None or x is None else f"{x - p:+.1f} s"
            print(f"| {path.stem} | " + " | ".join(cells) + f" | {lag} |")
    _steady(f"twin-{name}-steady", th)
    victims = newest = 0
    for path in _numbered(f"twin-{name}-*"):
        head = _header(path)
        for _, admitted, newest_then in head.get("victims") or []:
            victims += 1
            newest += admitted == newest_then
    if victims:
        print(f"\nvictims the twin's log named: {victims}; the newest running request: {newest}")


SIDECAR = next(n for n in FORECASTERS if n.startswith("the sidecar's"))
TWIN_KINDS = ("ramp", "poisson", "bursty", "trace", "sessions")
# the twin's runs #44's countdown was chosen on (docs/detection.md); every other is held out
CHOSEN_ON = {("llama8b", "ramp"): range(3), ("llama8b", "poisson"): range(3)}
# per choice made on the twins' runs, the first run of each kind recorded after it: `summary
# --after CHOICE` judges only these (docs/detection.md says what each choice was chosen on)
AFTER = {
    # exhaustion_refuted_rise, chosen on every run before it (2026-12-06)
    "rise": {
        ("llama8b", "ramp"): 3, ("llama8b", "poisson"): 6, ("llama8b", "bursty"): 2,
        ("llama8b", "trace"): 3, ("llama8b", "sessions"): 3, ("llama8b", "steady"): 5,
        ("qwen3moe", "ramp"): 3, ("qwen3moe", "poisson"): 3, ("qwen3moe", "bursty"): 3,
        ("qwen3moe", "trace"): 3, ("qwen3moe", "sessions"): 3, ("qwen3moe", "steady"): 3,
    },
    # exhaustion_usage_check_s, chosen on the 80 runs before it (2026-12-06, night): Azure
    # windows 2400-2550 and 3000-3150 s at a speed meant to fit, 2400-3000 s rising 1x -> 6x
    "usage-check": {
        ("llama8b", "trace"): 4, ("llama8b", "steady"): 7,
        ("qwen3moe", "trace"): 4, ("qwen3moe", "steady"): 5,
    },
    # the MoE's bent step curve (load_forecast.StepCurve), chosen on every run before it
    # (2026-12-07): the MoE twin's runs recorded after it; Llama's forecast is unchanged
    "moe-bend": {
        ("qwen3moe", "bursty"): 5, ("qwen3moe", "poisson"): 4, ("qwen3moe", "trace"): 5,
        ("qwen3moe", "sessions"): 4, ("qwen3moe", "steady"): 7,
    },
    # the MoE step curve's terms chosen by BIC (a3daf28), on every run before it (2026-12-07,
    # night): the MoE twin's runs recorded after it; Llama's forecast is unchanged
    "bic": {
        ("qwen3moe", "poisson"): 6, ("qwen3moe", "trace"): 6, ("qwen3moe", "steady"): 10,
    },
}  # fmt: skip


def _left_out(name: str, kind: str, after: str | None) -> range:
    """The run numbers `summary` leaves out: those chosen on, or with `after` every one
    recorded before that choice's first (a kind it has none of is left out whole)."""
    if after is not None:
        return range(AFTER[after].get((name, kind), 1 << 30))
    return CHOSEN_ON.get((name, kind), range(0))


def summary(names: list[str], th: Thresholds, after: str | None = None) -> None:
    """#44's targets per kind of run on the held-out runs (CHOSEN_ON left out; with `after`,
    only the runs recorded after that choice of AFTER), the twins
    `names` together and apart: the warning first on how many of the runs that ran out, its
    median lead at 0.5 s and 1 s scrapes, the sidecar's forecast 10 s out (median relative
    error), the thrashing state after the first preemption, and the false warnings on the
    healthy (steady) runs."""
    table = [
        "| kind | twin | runs | warned first, 0.5 s / 1 s | median lead, 0.5 s / 1 s | "
        "10 s out | thrashing after the first preemption |",
        "|---|---|---|---|---|---|---|",
    ]  # printed after the runs' own lines, which _ramps prints as it reads them
    for kind in TWIN_KINDS:
        rows = []
        for name in names:
            chosen = _left_out(name, kind, after)
            ramps = _ramps(f"twin-{name}-{kind}", th, chosen)
            lags = []
            for path in _numbered(f"twin-{name}-{kind}", chosen):
                st = _states(_load_run(path), th)
                if st["preemption"] is not None and st["thrashing"] is not None:
                    lags.append(st["thrashing"] - st["preemption"])
            rows.append((name, ramps, lags))
        for name, ramps, lags in [*rows, ("all", [r for _, rr, _ in rows for r in rr],
                                          [x for _, _, ll in rows for x in ll])]:  # fmt: skip
            if not ramps or (name == "all" and sum(1 for _, rr, _ in rows if rr) < 2):
                continue
            first = {e: [lead[e] for _, _, lead in ramps] for e in (1, 2)}
            errs = [x for _, e, _ in ramps for x in e[SIDECAR][10.0]]
            med = {e: statistics.median(v) for e, v in first.items()}
            table.append(f"| {kind} | {name} | {len(ramps)} | "
                  f"{sum(x >= 0 for x in first[1])} / {sum(x >= 0 for x in first[2])} of "
                  f"{len(ramps)} | "
                  f"{med[1]:.1f} / {med[2]:.1f} s | "
                  f"{statistics.median(errs):.0%} (n={len(errs)}) | "
                  f"{', '.join(f'{x:+.1f}' for x in lags)} s |")  # fmt: skip
    print("\n" + "\n".join(table))
    for name in names:
        _steady(f"twin-{name}-steady", th, _left_out(name, "steady", after))


def _recipe(ns: argparse.Namespace) -> Recipe:
    if ns.steady_in_flight is not None:
        stage, kind = None, "steady"
    elif ns.steady is not None:
        stage, kind = f"{ns.arrival}:rate={ns.steady:g}@90s", "steady"
    else:
        stage, kind = (POISSON_RAMP, "poisson") if ns.poisson_ramp else (RAMP, "run")
    if ns.stage is not None:
        stage = ns.stage
    in_flight = 2.0 if ns.steady_in_flight is None else ns.steady_in_flight
    trace: tuple[str, ...] = ()
    if ns.trace is not None:
        trace = (
            "--trace",
            str(ns.trace),
            "--trace-speed",
            str(ns.trace_speed),
            "--trace-length-scale",
            str(ns.trace_length_scale),
        )
        if ns.trace_speed_end is not None:
            trace += ("--trace-speed-end", str(ns.trace_speed_end))
        if ns.trace_window:
            trace += ("--trace-window", ns.trace_window)
        kind = "trace"
    return Recipe(
        stage, ns.prefix or kind, ns.nice, in_flight, ns.idle, ns.cpu_hog, ns.throttle,
        ns.twin, (ns.input_len, ns.output_len), ns.after_full, trace,
        tuple(shlex.split(ns.loadgen_args or "")),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--first", type=int, default=0, help="number of the first run (its seed)")
    r.add_argument(
        "--steady",
        type=float,
        metavar="RATE",
        help="record steady runs instead: RATE requests/s for 90 s",
    )
    r.add_argument(
        "--arrival", choices=("poisson", "constant"), default="poisson",
        help="how a steady run's requests are spaced (default: poisson)",
    )  # fmt: skip
    r.add_argument(
        "--poisson-ramp", action="store_true",
        help="the ramp's rate with Poisson arrivals (poisson-N.jsonl) instead of even sends",
    )  # fmt: skip
    r.add_argument(
        "--nice", type=int, default=10,
        help="the server's nice value (default 10: the load generator and scraper first)",
    )  # fmt: skip
    r.add_argument(
        "--steady-in-flight", type=float, metavar="N",
        help="a constant steady load that keeps N requests running on average, paced by "
        "Little's law before each run (as the live test paces its steady load)",
    )  # fmt: skip
    r.add_argument(
        "--idle", type=float, default=0.0, metavar="S",
        help="scrape S seconds of idle before the load starts (default 0; the live tests: 3)",
    )  # fmt: skip
    r.add_argument(
        "--cpu-hog", action="store_true",
        help="run a busy loop per CPU beside the server, at its priority (a slower machine)",
    )  # fmt: skip
    r.add_argument(
        "--throttle", type=float, metavar="CORES",
        help="let the server use CORES cores while the load runs (a cgroup v1 cpu quota, as "
        "root), after a steady load was paced at its full speed: it slows under the load",
    )  # fmt: skip
    r.add_argument("--prefix", help="name the files PREFIX-N.jsonl (default: by the load)")
    r.add_argument(
        "--twin", metavar="MODEL:GPU:KV_BYTES",
        help="record on the GPU twin (time scale 1) instead of the fixture, e.g. "
        "llama-3.1-8b:h100:16777216000 (8,000 blocks); with --stage and the lengths below",
    )  # fmt: skip
    r.add_argument("--stage", help="the loadgen stage to send instead of the default ramp")
    r.add_argument("--trace", type=Path, help="replay this trace instead (loadgen --trace)")
    r.add_argument("--trace-speed", type=float, default=1.0, metavar="X")
    r.add_argument("--trace-speed-end", type=float, metavar="Y",
                   help="the speed rises from X to Y: the trace's arrivals as a ramp")  # fmt: skip
    r.add_argument("--trace-length-scale", type=float, default=1.0, metavar="F")
    r.add_argument("--trace-window", metavar="START:END")
    r.add_argument(
        "--loadgen-args", metavar="ARGS",
        help="more of loadgen's arguments, sent with the stage, e.g. '--sessions --turns 4 "
        "--turn-input-len 200' (the stage's rate is then sessions a second)",
    )  # fmt: skip
    r.add_argument("--input-len", type=int, default=30, help="prompt tokens (30)")
    r.add_argument("--output-len", type=int, default=300, help="output tokens (300)")
    r.add_argument(
        "--after-full", type=float, default=5.0, metavar="S",
        help="a ramp is scraped S seconds after the cache ran out (5; the twin's: 30)",
    )  # fmt: skip
    sm = sub.add_parser("summary", help="#44's targets per kind over the twins' recordings")
    sm.add_argument("names", nargs="+", metavar="NAME", help="twins, e.g. llama8b qwen3moe")
    sm.add_argument(
        "--after", choices=sorted(AFTER),
        help="only the runs recorded after this choice was made (AFTER): rise "
        "(exhaustion_refuted_rise), usage-check (exhaustion_usage_check_s), moe-bend (the "
        "MoE's bent step curve), bic (its terms chosen by BIC)",
    )  # fmt: skip
    sm.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                    help="as evaluate's: judge with this threshold changed")  # fmt: skip
    e = sub.add_parser("evaluate")
    e.add_argument(
        "--twin", metavar="NAME",
        help="judge the twin's recordings twin-NAME-{ramp,poisson,steady}-N instead",
    )  # fmt: skip
    e.add_argument(
        "--threshold", action="append", default=[], metavar="NAME=VALUE",
        help="judge the alert with this threshold changed, as the sidecar's --threshold "
        "(exhaustion_countdown_s=0: no countdown; exhaustion_refuted_factor=0: no check on "
        "past forecasts); repeatable",
    )  # fmt: skip
    ns = ap.parse_args()
    if ns.cmd == "record":
        record(_recipe(ns), ns.runs, ns.first)
        return
    try:
        th = parse_overrides(ns.threshold)
    except ValueError as err:
        ap.error(str(err))
    if ns.cmd == "summary":
        summary(ns.names, th, ns.after)
        return
    if ns.twin:
        evaluate_twin(ns.twin, th)
    else:
        evaluate(th)


if __name__ == "__main__":
    main()
