"""KvwatchKvExhaustionImminent on the real vLLM fixture: a busy steady load is not warned about
once it has levelled off. (A ramp into thrashing is warned about first, paged, and the warning
resolved with the page: tests/sidecar/test_forecast_replay.py replays a recorded ramp through a
real sidecar and asserts each of these; on the live server whether the warning comes first is a
matter of the machine's stalls, 12-29 s ahead in four runs of six here, measured over many
ramps by bench/bench_forecast.py.)

A busy load that starts from idle and then holds its level is not warned about once it has
levelled off: its first seconds look like a ramp to a line through the minute, but the forecast
recedes while the level holds, and the warning waits for a countdown (`exhaustion_countdown_s`).
The rise itself is not always told apart: in CI, a steady load that took 15 s to fill the cache to
its level (peak 72%) was warned about 19 s in, once (docs/detection.md). That early warning is
printed and counted in the docs, not asserted away; a warning after the rise, or a second one,
fails the test.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvwatch.loadgen.results.server_metrics import TimelineRecorder
from kvwatch.local.server import LocalVLLM, stop_process
from tests.burst import rate_for_in_flight
from tests.receiver import alert_events, receiver
from tests.sidecar.running import ran_out_at, running_sidecar, runs

pytestmark = pytest.mark.integration

IMMINENT = "KvwatchKvExhaustionImminent"
# the steady load keeps this many requests (30 + 300 tokens, 11 blocks each) running on
# average, paced by Little's law with the time two take together: evenly spaced, with no
# queue (peak KV 41% on an AVX2 machine here, where the old pacing gave 28%)
STEADY_IN_FLIGHT = 2.0
# the steady load has filled the cache to its level by then (5-15 s here and in CI): a warning
# after it is one the countdown should have held
LEVELLED_S = 30.0
# a server that slowed under the load holds more than this times STEADY_IN_FLIGHT after
# LEVELLED_S: its KV rises again, a second rise no forecast can tell from a ramp's
# (docs/detection.md), and a warning then is no false alert. CI's slower machine once went
# from 30% to 60-70% KV (about 3.5 requests) from 25 s on and was warned 38 s in; here a
# level load holds 2.7
SLOWED = 1.5


def _loadgen(base: str, run_dir: Path, stage: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(run_dir), "--no-progress", "--stage", stage, "--input-len", "30",
         "--output-len", "300", "--seed", str(seed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


class _Forecasts:
    """Polls the sidecar's state: (unix time, state, forecast seconds, KV usage), for a failure
    to show what the sidecar saw."""

    def __init__(self, url: str) -> None:
        self.url, self.rows = url, []  # type: list[tuple[float, str, float | None, float]]
        self.down: list[float] = []  # polls that found the target down (a scrape failed)
        self.unanswered = 0
        self.scrapes: tuple[int, dict[str, int]] = (0, {})
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.25):
                try:
                    target = client.get(self.url + "/api/state").json()["targets"][0]
                    (e,) = target["engines"]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    self.unanswered += 1
                    continue
                self.scrapes = (target["scrapes"], target["scrape_errors"])
                if not e["present"]:
                    self.down.append(time.time())
                    continue
                sig = e["signals"]
                self.rows.append(
                    (time.time(), e["state"], sig["seconds_to_exhaustion"], sig["kv_usage"] or 0)
                )

    def __enter__(self) -> _Forecasts:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()

    def summary(self, ref: float) -> str:
        """The whole poll on one line, timed from `ref`: runs of state, KV usage and whether the
        forecast was within the warning's horizon; the polls that found the target down."""

        def label(state: str, fc: float | None, kv: float) -> str:
            horizon = "-" if fc is None else "<=30s" if fc <= 30 else ">30s"
            return f"{state} kv{kv:.1f} fc{horizon}"

        points = [(t, label(state, fc, kv)) for t, state, fc, kv in self.rows]
        points += [(d, "down") for d in self.down]
        return (
            f"sidecar: {runs(sorted(points), ref)}; scrapes (count, errors) {self.scrapes}; "
            f"{self.unanswered} polls unanswered"
        )


@contextmanager
def _watched(
    base: str, interval_s: float
) -> Iterator[tuple[list[dict], TimelineRecorder, _Forecasts, float]]:
    """A sidecar on `base` sending its webhooks to a receiver, with vLLM's own /metrics and the
    sidecar's state polled beside it, after 3 s of idle points (a load then starts from idle).
    Yields what the receiver got, the two pollers, and vLLM's preemption count so far."""
    with receiver() as (hook, got):
        args = ["--target", base, "--interval", f"{interval_s:g}", "--webhook", hook]
        with (
            running_sidecar(args) as url,
            TimelineRecorder(base, period_s=0.25) as own,
            _Forecasts(url) as seen,
        ):
            time.sleep(3.0)
            assert own.rows, "vLLM's own /metrics gave nothing"
            assert not [e for e in alert_events(got) if e[2] == IMMINENT], alert_events(got)
            yield got, own, seen, own.rows[-1]["preemptions_total"] or 0.0


@dataclass
class _SteadyRun:
    """One steady load under a watched sidecar: what it judged, and whether the run was valid
    (a cache that ran out makes it no healthy load, and says nothing of false alerts)."""

    events: list[tuple[float, str, str]]  # unix time as the sidecar stamped them
    started: float  # unix time the load started
    peak: float
    full_at: float | None
    held_after: float  # requests held (running + waiting), mean after LEVELLED_S
    summary: str
    forecasts_within: int

    def fired(self) -> list[float]:
        """When the warning fired, seconds into the load."""
        return [t - self.started for t, status, name in self.events
                if name == IMMINENT and status == "firing"]  # fmt: skip

    def late(self) -> list[float]:
        """The warnings after the load had levelled off, seconds into it."""
        return [round(t, 1) for t in self.fired() if t > LEVELLED_S]


def _steady_run(base: str, run_dir: Path, seed: int) -> _SteadyRun:
    # the rate is this machine's: a fixed one was idle on a fast machine and ran out on a slow one
    rate, took = asyncio.run(rate_for_in_flight(base, STEADY_IN_FLIGHT, seed=seed))
    steady = f"constant:rate={rate:.3f}@60s"
    with _watched(base, 1.0) as (got, own, seen, before):
        t0 = time.time()
        load = _loadgen(base, run_dir, steady, seed=seed)
        try:
            assert load.wait(timeout=150) == 0, "the steady load failed"
        finally:
            stop_process(load)
        time.sleep(2.0)
    rows = [r for r in own.rows if r["t"] >= t0]
    after = [(r["running"] or 0.0) + (r["waiting"] or 0.0)
             for r in rows if LEVELLED_S <= r["t"] - t0 <= 60.0]  # fmt: skip
    return _SteadyRun(
        events=alert_events(got),
        started=t0,
        peak=max((r["kv_usage"] or 0.0) for r in rows),
        full_at=ran_out_at(rows, before),
        held_after=sum(after) / len(after) if after else 0.0,
        summary=f"{steady} (2 requests at once took {took:.1f} s); {seen.summary(t0)}",
        forecasts_within=len([fc for _, _, fc, _ in seen.rows if fc is not None and fc <= 30]),
    )


def test_a_busy_steady_load_is_not_warned_once_it_has_levelled(
    vllm_server: LocalVLLM, tmp_path: Path, live_retry: Callable[[str], None]
) -> None:
    # one more run when the first was no steady load: a machine that stalls the server for
    # seconds (docs/testing.md) makes it admit what queued at once and run the cache out, or
    # slows it under the load so that it holds more and its KV rises again, and a warning of
    # that second rise is no false alert
    runs = []
    slowed_at = SLOWED * STEADY_IN_FLIGHT
    for attempt in range(2):
        run = _steady_run(vllm_server.base_url, tmp_path / f"steady-{attempt}", seed=7 + attempt)
        runs.append(run)
        if run.full_at is not None:
            live_retry(f"the steady load ran the cache out at {run.full_at:.1f} s")
        elif run.late() and run.held_after > slowed_at:
            live_retry(f"warned {run.late()} s in, the server slowed: it held "
                       f"{run.held_after:.1f} requests after levelling")  # fmt: skip
        else:
            break
    said = " | ".join(r.summary for r in runs)
    assert run.full_at is None, f"the steady load ran the cache out twice (stalls?): {said}"
    assert run.peak >= 0.3, f"the load was not busy (peak KV {run.peak:.0%}): {run.summary}"
    print(f"peak KV {run.peak:.0%}; {run.held_after:.1f} requests held after levelling; "
          f"forecast within 30 s at {run.forecasts_within} polls; {said}")  # fmt: skip
    print(f"KvwatchKvExhaustionImminent fired {[round(t, 1) for t in run.fired()]} s into the load")
    assert len(run.fired()) <= 1, f"warned more than once: {run.events}; {run.summary}"
    assert not run.late(), (
        f"warned after the load had levelled off, {run.late()} s in, holding "
        f"{run.held_after:.1f} requests (paced for {STEADY_IN_FLIGHT:g}); {said}"
    )
