"""Run a Debian-packaged server (Prometheus, Alertmanager) for a test: free port, its own temp
dir, readiness by `/-/ready`, stopped by its PID and cleaned up."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from loadgen.local_server import free_port

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
            for _ in range(100):
                try:
                    if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                raise RuntimeError(f"{name} did not start: " + log_path.read_text())
            yield url
        finally:
            proc.terminate()
            proc.wait(15)
            shutil.rmtree(tmp, ignore_errors=True)
