"""KvwatchKvExhaustionImminent on the real vLLM fixture: sent before the first preemption of a
rising load, once, and gone once saturation or thrashing pages. (Silence on busy steady loads is
not claimed: on this 40-block cache every steady load the bench tried ran out, and the warning
also fires in the first seconds of a load that starts from idle; docs/detection.md.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvwatch.loadgen.local_server import LocalVLLM, stop_process
from kvwatch.loadgen.server_metrics import TimelineRecorder
from tests.receiver import receiver
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration

IMMINENT = "KvwatchKvExhaustionImminent"
RAMP = "ramp:start=0.2,end=3@90s"  # the bench's ramp: the cache runs out 28-51 s in


def _loadgen(base: str, run_dir: Path, stage: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(run_dir), "--no-progress", "--stage", stage, "--input-len", "30",
         "--output-len", "300", "--seed", str(seed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _events(got: list[dict]) -> list[tuple[float, str, str]]:
    return [(g["t"], g["body"]["status"], g["body"]["alertname"]) for g in got]


def _full_at(rows: list[dict], before: float) -> float | None:
    """The first sample of vLLM's own /metrics with the cache out of blocks: usage at 100% or
    the preemption counter risen (it rises when the victim runs again, so it lags)."""
    return next(
        (r["t"] for r in rows
         if (r["kv_usage"] or 0) >= 1.0 or (r["preemptions_total"] or 0) > before),
        None,
    )  # fmt: skip


def test_warned_before_the_first_preemption_of_a_ramp(
    vllm_server: LocalVLLM, tmp_path: Path
) -> None:
    base = vllm_server.base_url
    with receiver() as (hook, got):
        args = ["--target", base, "--interval", "0.5", "--webhook", hook]
        with running_sidecar(args), TimelineRecorder(base, period_s=0.25) as own:
            time.sleep(3.0)  # the sidecar has a few idle points before the load
            assert own.rows, "vLLM's own /metrics gave nothing"
            before = own.rows[-1]["preemptions_total"] or 0.0
            assert not [e for e in _events(got) if e[2] == IMMINENT], _events(got)

            t0 = time.time()
            ramp = _loadgen(base, tmp_path / "ramp", RAMP, seed=32)
            try:
                deadline = time.monotonic() + 120
                full_at = None
                while full_at is None and time.monotonic() < deadline and ramp.poll() is None:
                    time.sleep(0.5)
                    full_at = _full_at([r for r in own.rows if r["t"] >= t0], before)
                assert full_at is not None, "the ramp never ran the cache out"
                time.sleep(10.0)  # preemptions pile up: saturation or thrashing takes over
            finally:
                stop_process(ramp)
            time.sleep(3.0)
    events = _events(got)
    fired = [t for t, status, name in events if name == IMMINENT and status == "firing"]
    assert fired, f"no warning before the cache ran out at {full_at - t0:.1f} s: {events}"
    lead = full_at - fired[0]
    print(f"warned {lead:.1f} s before the cache ran out ({full_at - t0:.1f} s into the ramp)")
    assert lead > 0, events
    # one warning, and it gave way to the page that followed
    assert len(fired) == 1, events
    full = ("KvwatchKvCacheSaturated", "KvwatchThrashing")
    pages = [t for t, status, name in events if status == "firing" and name in full]
    resolved = [t for t, status, name in events if name == IMMINENT and status == "resolved"]
    assert pages and resolved, events
    assert resolved[0] <= pages[0] + 2.0, events  # judged on the same scrape, sent together
