"""`kvwatch fleet` stopped while it starts: every twin and sidecar under way is stopped too.
Before, SIGTERM waited until every replica was up, and Ctrl-C exited 130 leaving two twins and
two sidecars running (their starts went on in threads nobody waited for)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _ours(work: Path) -> list[int]:
    """Live processes started for this fleet: their environment or command line names its
    folder (the twin's settings carry its status path; a sidecar's log is there)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            seen = (d / "environ").read_bytes() + (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if str(work).encode() in seen and state != "Z":
            pids.append(int(d.name))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_fleet_stopped_while_it_starts_leaves_nothing_running(
    tmp_path: Path, sig: signal.Signals
) -> None:
    work = tmp_path / "fleet"
    p = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "fleet", "--replicas", "2", "--kv-blocks", "400",
         "--max-model-len", "2048", "--work-dir", str(work)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    with p:  # closes its pipe whatever happens (left open, a later test met its ResourceWarning)
        try:
            deadline = time.monotonic() + 60
            # both twins' vLLM started, neither ready yet (a start takes 15-30 s here)
            while len(list(work.glob("replica-*-vllm.log"))) < 2:
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
                time.sleep(0.2)
            time.sleep(2)
            t0 = time.monotonic()
            p.send_signal(sig)
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                for pid in [p.pid, *_ours(work)]:  # nothing of it left for the tests after
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"still running 60 s after {sig.name}:\n"
                                     f"{p.communicate()[0][-3000:]}") from None  # fmt: skip
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
    assert "Ctrl-C stops everything" not in out, out  # it was stopped before it was up
    assert took < 30, (took, out[-2000:])
    assert p.returncode in (2, 3, 130, -signal.SIGTERM), (p.returncode, out[-2000:])
    time.sleep(1)
    assert _ours(work) == [], out[-2000:]
