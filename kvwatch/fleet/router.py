"""vLLM's own router (`vllm-router`, a Rust binary in a wheel) in front of the replicas: started
with a policy, told of replicas as they come (`/add_worker`), restarted on the same port to
change policy (it has no call for that), stopped by its PID."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from kvwatch.common.cli_kit import CliError
from kvwatch.local.server import free_port, stop_process, wait_until_ok

__all__ = ["Router", "router_binary", "POLICIES"]

POLICIES = ("round_robin", "cache_aware", "power_of_two", "random", "consistent_hash")
_READY_S = 30.0


def router_binary() -> str:
    """The `vllm-router` beside this Python (its venv's bin) or on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise CliError("vllm-router is not installed: pip install 'kvwatch[fleet]'")
    return found


class Router:
    """One vllm-router process on 127.0.0.1; its metrics on their own port."""

    def __init__(self, workers: list[str], policy: str, log_path: Path) -> None:
        if policy not in POLICIES:
            raise CliError(f"router policy {policy!r}: one of {', '.join(POLICIES)}")
        self.workers = list(workers)
        self.policy = policy
        self.log_path = log_path
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def start(self) -> None:
        cmd = [
            router_binary(), "--host", "127.0.0.1", "--port", str(self.port),
            "--policy", self.policy, "--worker-urls", *self.workers,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            # a load generator's streams are the router's queue: let them through to vLLM,
            # whose own queue is what kvwatch watches
            "--max-concurrent-requests", "4096", "--queue-size", "4096",
            # a replica killed on purpose must not be retried onto the others mid-request
            "--disable-retries", "--health-check-interval-secs", "2",
            "--log-level", "warning",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        if not wait_until_ok(self.url + "/health", self.proc, _READY_S):
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise CliError(f"vllm-router did not start: {tail}")

    def add_worker(self, url: str) -> None:
        r = httpx.post(self.url + "/add_worker", params={"url": url}, timeout=30)
        if r.status_code >= 400:
            raise CliError(f"vllm-router refused worker {url}: HTTP {r.status_code} {r.text}")
        self.workers.append(url)

    def list_workers(self) -> list[str]:
        return list(httpx.get(self.url + "/list_workers", timeout=10).json().get("urls", []))

    def restart(self, policy: str) -> None:
        """The same workers under another policy, on the same port."""
        if policy not in POLICIES:
            raise CliError(f"router policy {policy!r}: one of {', '.join(POLICIES)}")
        self.stop()
        self.policy = policy
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=5.0)
            self.proc = None
