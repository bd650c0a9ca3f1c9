"""Run a Debian-packaged server (Prometheus, Alertmanager): free port, its own temp dir,
readiness by `/-/ready`, stopped by its PID and cleaned up."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvwatch.local.server import free_port, stop_process, wait_until_ok

__all__ = ["running_service"]


@contextmanager
def running_service(name: str, tmp: Path, argv: Callable[[int], list[str]]) -> Iterator[str]:
    """`argv(port)` is the command line; yields the base URL once `/-/ready` answers."""
    port = free_port()
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv(port), stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            if not wait_until_ok(url + "/-/ready", proc, 10.0, period_s=0.1):
                raise RuntimeError(f"{name} did not start: " + log_path.read_text())
            yield url
        finally:
            stop_process(proc)
            shutil.rmtree(tmp, ignore_errors=True)
