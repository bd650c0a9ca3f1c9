"""Run `kvwatch sidecar` as its own process (as in production) and read its endpoint."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kvwatch.local.server import free_port, stop_process, wait_until_ok
from kvwatch.sidecar.metrics.exposition import Sample

__all__ = ["running_sidecar", "kvwatch_samples", "Sidecar", "runs", "ran_out_at"]


class Sidecar(str):
    """The sidecar's base URL, carrying its process for tests that kill it, and what it has
    printed so far (read as it comes, so a full pipe can never stall it)."""

    proc: subprocess.Popen[bytes]
    printed: bytearray

    def output(self) -> str:
        return self.printed.decode(errors="replace")

    def stacks(self, wait_s: float = 1.0, tail: int = 8000) -> str:
        """The end of what the sidecar printed, ending with every thread's stack (it prints
        them on SIGUSR1): for a test to say what a sidecar that stopped answering was doing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(wait_s)
        return self.output()[-tail:]


def _drain(proc: subprocess.Popen[bytes], into: bytearray) -> None:
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        into.extend(chunk)


@contextmanager
def running_sidecar(
    args: list[str],
    ready_timeout: float = 20.0,
    kvwatch: Sequence[str] = (sys.executable, "-m", "kvwatch"),
    cwd: Path | None = None,
) -> Iterator[Sidecar]:
    """`kvwatch` is the command to run (another install's, say), `cwd` where to run it. With no
    `--db` in `args` the sidecar keeps its state in memory: a test never shares the user's
    default file (~/.local/state/kvwatch/sidecar.db) with another test's sidecar."""
    if "--db" not in args:
        args = [*args, "--db", ""]
    port = free_port()
    cmd = [*kvwatch, "sidecar", "--listen", f"127.0.0.1:{port}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd)
    url = Sidecar(f"http://127.0.0.1:{port}")
    url.proc, url.printed = proc, bytearray()
    reader = threading.Thread(target=_drain, args=(proc, url.printed), daemon=True)
    reader.start()
    try:
        if not wait_until_ok(url + "/healthz", proc, ready_timeout, period_s=0.1):
            stop_process(proc)
            reader.join(5)
            raise RuntimeError(f"sidecar did not start: {url.output()}")
        yield url
    finally:
        stop_process(proc)
        reader.join(5)
        if proc.stdout:
            proc.stdout.close()


def kvwatch_samples(url: str) -> dict[str, list[Sample]]:
    """The sidecar's own metrics by name (labels and value), read with a plain text split."""
    text = httpx.get(url + "/metrics", timeout=5).text
    out: dict[str, list[Sample]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = dict(p.split("=", 1) for p in labels.rstrip("}").split(",") if p)
        out.setdefault(name, []).append(
            Sample("", {k: v.strip('"') for k, v in pairs.items()}, float(value))
        )
    return out


def runs(points: Sequence[tuple[float, str]], t0: float, gap_s: float = 1.0) -> str:
    """Polled labels as runs on one short line, timed from `t0`: "0.0-2.3 ok | 2.5-4.0 ...",
    with the gaps of over `gap_s` between polls marked (a sidecar or a server that did not
    answer). For a failure message that must survive a CI log cut to its first line."""
    out: list[str] = []
    start = prev = None
    label = ""
    for t, lab in points:
        if start is not None and prev is not None and (lab != label or t - prev > gap_s):
            out.append(f"{start - t0:.1f}-{prev - t0:.1f} {label}")
            if t - prev > gap_s:
                out.append(f"gap {t - prev:.1f}s")
            start = None
        if start is None:
            start, label = t, lab
        prev = t
    if start is not None and prev is not None:
        out.append(f"{start - t0:.1f}-{prev - t0:.1f} {label}")
    return " | ".join(out)


def ran_out_at(rows: Sequence[dict[str, Any]], before: float) -> float | None:
    """The first server row (loadgen's summarize_engines: t, kv_usage, preemptions_total) with
    the cache out of blocks: usage at 100% or the preemption counter risen past `before` (it
    rises when the victim runs again, so it lags). bench/bench_forecast.py's truth."""
    return next(
        (r["t"] for r in rows
         if (r["kv_usage"] or 0) >= 1.0 or (r["preemptions_total"] or 0) > before),
        None,
    )  # fmt: skip
