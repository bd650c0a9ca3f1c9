"""Freeze, then kill, a real vLLM's engine (its EngineCore process, not the API server) under a
sidecar:
- frozen (SIGSTOP) while a request streams: the API answers, no token comes, and the sidecar
  says the engine is stuck; thawed (SIGCONT), alive again;
- killed and kept alive (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, as orchestrators that judge by
  /health run it): the API answers /metrics, /health answers 503, and the sidecar says the
  engine is dead, exports kvwatch_engine_alive 0 and sends KvwatchEngineDead to its webhook;
- as vLLM runs by default: the API server exits about 5 s after its engine; the sidecar, which
  follows the log, says the engine died (with vLLM's own words) before KvwatchTargetDown;
- `kvwatch logs` on that log reports the death with its time and exits 1.
Two extra servers, about 20 s each to start."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kvwatch.local.server import LocalVLLM, ServerConfig
from tests.burst import run_burst
from tests.receiver import receiver
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration


def engine_core_pid(server_pid: int) -> int:
    """The EngineCore child of the API server (vLLM titles it `VLLM::EngineCore`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and "EngineCore" in cmd:
            return int(entry.name)
    raise AssertionError(f"no EngineCore child of {server_pid}")


def state_of(side: str) -> dict:
    (t,) = httpx.get(side + "/api/state", timeout=5).json()["targets"]
    return t


def wait_for(what, timeout: float = 30.0, seen=None):  # type: ignore[no-untyped-def]
    """`seen()` says, on a timeout, what there was instead. A poll the sidecar did not answer
    in time is polled again: a shared machine can stall any process for seconds
    (docs/testing.md)."""
    deadline = time.monotonic() + timeout
    unanswered: list[str] = []
    while time.monotonic() < deadline:
        try:
            got = what()
        except httpx.HTTPError as e:
            unanswered.append(repr(e))
            continue
        if got:
            return got
        time.sleep(0.3)
    said = f"; {len(unanswered)} polls unanswered ({unanswered[-1]})" if unanswered else ""
    try:
        instead = f"; {seen()}" if seen else ""
    except httpx.HTTPError as e:
        instead = f"; and then: {e!r}"
    raise AssertionError(f"timed out after {timeout:g} s{said}{instead}")


@contextmanager
def _streaming(base_url: str) -> Iterator[list[str]]:
    """Two 900-token streams at a time, burst after burst, until the block ends; yields how
    each burst ended (for a failure message). A burst still in flight at the end is left to
    end on its own (its thread is a daemon)."""
    ended: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                got = asyncio.run(run_burst(base_url, n=2, max_tokens=900))
                ended.append(", ".join(f"{len(r.token_times)} tokens {r.error}" for r in got))
            except Exception as e:  # a failing burst is said, and the next one tried
                ended.append(repr(e))
                stop.wait(0.5)

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield ended
    finally:
        stop.set()


def test_an_engine_killed_behind_a_live_api(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    cfg = ServerConfig(model=tiny_model, nice=10, env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    with LocalVLLM(cfg, log_path=log) as srv, receiver() as (hook, got):
        args = [
            "--target", srv.base_url, "--interval", "0.5", "--db", "", "--log", str(log),
            "--log-from-start", "--webhook", f"{hook},alertmanager",
            "--threshold", "engine_dead_after_s=2", "--threshold", "engine_stuck_after_s=4",
        ]  # fmt: skip
        with running_sidecar(args) as side:
            wait_for(lambda: state_of(side).get("engine_status") == "alive")
            assert srv.pid is not None
            core = engine_core_pid(srv.pid)
            with _streaming(srv.base_url) as ended:
                # a stream must be running when the engine freezes: bursts follow one another,
                # so a sidecar that misses the first (a machine stalled for seconds) sees the next
                wait_for(
                    lambda: any(
                        (e["signals"]["running"] or 0) > 0 for e in state_of(side)["engines"]
                    ),
                    seen=lambda: f"bursts ended: {ended}; the sidecar: {state_of(side)}",
                )
                os.kill(core, signal.SIGSTOP)
                try:
                    t = wait_for(lambda: (s := state_of(side))["engine_status"] == "stuck" and s)
                    assert "no token generated for" in t["engine_status_reason"], t
                finally:
                    os.kill(core, signal.SIGCONT)
                wait_for(lambda: state_of(side)["engine_status"] == "alive")
            os.kill(core, signal.SIGKILL)
            t = wait_for(lambda: (s := state_of(side))["engine_status"] == "dead" and s)
            assert t["up"] is True  # the API still answers /metrics
            assert "/health failed (HTTP 503)" in t["engine_status_reason"]
            assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 503
            text = httpx.get(side + "/metrics", timeout=5).text
            assert (
                "kvwatch_engine_alive{" in text
                and "} 0.0" in text.split("kvwatch_engine_alive{", 1)[1].split("\n", 1)[0]
            )
            names = wait_for(lambda: [
                g["body"]["commonLabels"]["alertname"] for g in got
                if g["body"]["status"] == "firing"
            ])  # fmt: skip
            assert "KvwatchEngineDead" in names, names
            incidents = wait_for(lambda: state_of(side)["log"]["incidents"])
            assert any(i["what"] == "engine_death" for i in incidents), incidents


def test_an_engine_killed_as_vllm_runs_by_default(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    with LocalVLLM(ServerConfig(model=tiny_model, nice=10), log_path=log) as srv:
        args = [
            "--target", srv.base_url, "--interval", "0.5", "--db", "", "--log", str(log),
            "--log-from-start",
        ]  # fmt: skip
        with running_sidecar(args) as side:
            wait_for(lambda: state_of(side).get("engine_status") == "alive")
            assert srv.pid is not None
            killed_at = time.monotonic()
            os.kill(engine_core_pid(srv.pid), signal.SIGKILL)
            t = wait_for(lambda: (s := state_of(side))["engine_status"] == "dead" and s)
            assert "the log says: engine_death" in t["engine_status_reason"], t
            # said within seconds, long before KvwatchTargetDown's two minutes
            assert time.monotonic() - killed_at < 30
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "logs", str(log)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    assert "engine_death" in p.stdout, p.stdout
