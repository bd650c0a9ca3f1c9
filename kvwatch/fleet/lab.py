"""A fleet on this machine from real parts, started and stopped as one.

N replicas of one model, each a kvwatch twin (vLLM's own engine on a simulated card) with its
sidecar beside it, behind vllm-router; Prometheus discovers the servers and the sidecars from
files the fleet rewrites as replicas come and go (as Kubernetes' discovery would), evaluates
kvwatch's rules (their `for:` optionally scaled down) and sends to Alertmanager, which runs
the shipped routing and posts to a local receiver. Everything it starts it stops, by PID,
whatever happens; temporary directories go with it unless a work directory was given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_OK, CliError
from kvwatch.fleet.alertmanager import running_alertmanager, shipped_config
from kvwatch.fleet.prometheus import running_prometheus, wait_for_series, write_file_sd
from kvwatch.fleet.receiver import NotificationReceiver
from kvwatch.fleet.router import Router
from kvwatch.fleet.sidecars import start_sidecar
from kvwatch.local.server import restore_sigterm, sigterm_interrupts, stop_process
from kvwatch.twin.serve import TwinServer, kv_bytes_for_blocks, start_twin

__all__ = [
    "FleetSpec", "Replica", "Fleet", "REPLICA_BYTES", "available_memory", "memory_needed",
    "parallel_starts",
]  # fmt: skip


# Prometheus scrapes and evaluates every second: a lab's rules judge within seconds, and the
# fleet advice reads the peak at this step.
SCRAPE_INTERVAL = "1s"


# A replica's host memory: a twin of llama-3.1-8b measured 1.1 GB RSS (its API server and
# engine core, 2026-12-05), its sidecar about 60 MB; planned with a margin.
REPLICA_BYTES = 3 * 2**29  # 1.5 GiB
SERVICES_BYTES = 2**29  # Prometheus, Alertmanager, the router
MAX_PARALLEL_STARTS = 4  # vLLM's start is CPU-bound: more at once only slows each


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_needed(replicas: int) -> int:
    return replicas * REPLICA_BYTES + SERVICES_BYTES


def parallel_starts(n: int) -> int:
    """Replicas started at once: a few, and no more than the machine's CPUs and memory hold."""
    mem = available_memory()
    by_mem = MAX_PARALLEL_STARTS if mem is None else max(1, mem // REPLICA_BYTES)
    return max(1, min(n, MAX_PARALLEL_STARTS, os.cpu_count() or 1, by_mem))


@dataclass(frozen=True)
class FleetSpec:
    replicas: int = 2
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    kv_blocks: int = 2000  # per replica
    max_model_len: int = 8192
    time_scale: float = 1.0  # wall seconds per simulated second, every twin alike
    policy: str = "round_robin"
    rules_for_scale: float = 1.0  # the rules' `for:` scaled (labs: see a page in seconds)
    vllm_args: tuple[str, ...] = ()


@dataclass
class Replica:
    index: int
    twin: TwinServer
    sidecar: subprocess.Popen[bytes]
    sidecar_url: str
    killed: bool = False

    @property
    def url(self) -> str:
        return self.twin.base_url


@dataclass
class Fleet:
    spec: FleetSpec
    work_dir: Path | None = None
    echo: bool = False
    replicas: list[Replica] = field(default_factory=list)
    prometheus: str = ""
    alertmanager: str = ""

    def __post_init__(self) -> None:
        # sized first: settings it refuses leave no folder behind
        self._kv_bytes = kv_bytes_for_blocks(
            self.spec.model, self.spec.gpu, self.spec.kv_blocks, self.spec.max_model_len
        )
        self._own_dir = self.work_dir is None
        if self.work_dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="kvwatch-fleet-"))
        else:
            self.dir = self.work_dir
            self.dir.mkdir(parents=True, exist_ok=True)
        self._stack = ExitStack()
        self._sigterm_before: Any = None
        self._lock = threading.Lock()
        self._cancel = threading.Event()  # set on Ctrl-C/SIGTERM: starts under way give up
        self.receiver = NotificationReceiver(echo=self.echo)
        self.router: Router | None = None

    # --- bring-up -------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        # a SIGTERM to this process unwinds like Ctrl-C, so everything started is stopped
        self._sigterm_before = sigterm_interrupts()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        from kvwatch.alerts.build import render_rules

        self._stack.enter_context(self.receiver)
        self.alertmanager = self._stack.enter_context(
            running_alertmanager(shipped_config(hook_base=self.receiver.base))
        )
        self._sd = {job: self.dir / f"{job}-targets.json" for job in ("vllm", "kvwatch")}
        for path in self._sd.values():
            write_file_sd(path, [])
        self.add_replicas(self.spec.replicas, register=False)
        self.router = Router([r.url for r in self.replicas], self.spec.policy,
                             self.dir / "router.log")  # fmt: skip
        self.router.start()
        self._stack.callback(self.router.stop)
        self.prometheus = self._stack.enter_context(
            running_prometheus(
                {"router": [self.router.metrics_address]},
                interval=SCRAPE_INTERVAL,
                rules=render_rules(for_scale=self.spec.rules_for_scale),
                alertmanager=self.alertmanager.removeprefix("http://"),
                discovered=self._sd,
            )
        )
        n = len(self.replicas)
        wait_for_series(self.prometheus, f'count(up{{job="kvwatch"}} == 1) == {n}', 60)
        wait_for_series(
            self.prometheus, f"count({{__name__=~'vllm[:_]kv_cache_usage_perc'}}) == {n}", 60
        )

    def _start_replica(self, index: int) -> Replica:
        s = self.spec
        log = self.dir / f"replica-{index}-vllm.log"
        twin = start_twin(
            s.model, s.gpu, log, time_scale=s.time_scale, seed=index,
            status_dir=self.dir / f"replica-{index}", cancel=self._cancel,
            vllm_args=("--max-model-len", str(s.max_model_len),
                       "--kv-cache-memory-bytes", str(self._kv_bytes), *s.vllm_args),
        )  # fmt: skip
        try:
            proc, url = start_sidecar(twin.base_url, self.dir, f"replica-{index}-sidecar", log=log)
        except BaseException:
            twin.stop()
            raise
        return Replica(index, twin, proc, url)

    def add_replicas(self, n: int, register: bool = True) -> list[Replica]:
        """Start `n` more replicas, `parallel_starts(n)` at a time; with `register`, tell the
        router of them (as an operator scaling out does). Discovery files are rewritten for
        Prometheus. Interrupted (Ctrl-C, or SIGTERM as one), the starts under way give up and
        every replica made is in `replicas`, for stop() to stop."""
        first = len(self.replicas)
        for i in range(first, first + n):
            (self.dir / f"replica-{i}").mkdir(exist_ok=True)
        made: list[Replica | BaseException] = [RuntimeError("not started")] * n
        slots = threading.Semaphore(parallel_starts(n))

        def start(k: int) -> None:
            with slots:
                if self._cancel.is_set():
                    return
                try:
                    r = self._start_replica(first + k)
                except BaseException as e:  # noqa: BLE001 (handed to the caller below)
                    made[k] = e
                    return
                made[k] = r
                with self._lock:  # at once: an interrupted start-up still stops it
                    self.replicas.append(r)

        threads = [threading.Thread(target=start, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:
            self._cancel.set()  # each start under way ends within a readiness poll
            for t in threads:
                t.join()
            raise
        new = [r for r in made if isinstance(r, Replica)]
        with self._lock:
            self.replicas.sort(key=lambda r: r.index)
        self._write_discovery()
        errors = [e for e in made if not isinstance(e, Replica)]
        if errors:
            raise errors[0]
        if register and self.router is not None:
            for r in new:
                self.router.add_worker(r.url)
        return new

    def _write_discovery(self) -> None:
        # a killed replica stays in discovery, server and sidecar, as a crashed pod does in
        # Kubernetes' (its server's `up` goes 0; its sidecar reports the target down)
        write_file_sd(self._sd["vllm"], [r.url.removeprefix("http://") for r in self.replicas])
        write_file_sd(
            self._sd["kvwatch"], [r.sidecar_url.removeprefix("http://") for r in self.replicas]
        )

    # --- faults and changes ---------------------------------------------------------------

    def kill(self, index: int) -> None:
        """Kill a replica's server outright (its sidecar stays and sees it go), as a crash."""
        r = self.replicas[index]
        r.twin.server.stop(first_signal=signal.SIGKILL)
        r.killed = True

    def set_policy(self, policy: str) -> None:
        assert self.router is not None
        self.router.restart(policy)

    @property
    def url(self) -> str:
        assert self.router is not None
        return self.router.url

    def run_load(self, run_dir: Path, *load_args: str) -> tuple[float, float, dict[str, Any]]:
        """`kvwatch loadgen run` through the router with these arguments (a trace, stages);
        returns its wall start and end and its summary. Raises CliError if it fails. The run
        reads no /metrics through the router (Prometheus has the replicas'): the router would
        answer from a replica of its choosing and count each read in its policy."""
        cmd = [
            sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", self.url,
            "--server-metrics", "none", "--run-dir", str(run_dir), "--no-progress", "--json",
            *load_args,
        ]  # fmt: skip
        start = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        end = time.time()
        if p.returncode not in (EXIT_OK, EXIT_FOUND):
            raise CliError(f"kvwatch loadgen run failed ({p.returncode}): {p.stderr[-2000:]}")
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        return start, end, summary

    # --- teardown -------------------------------------------------------------------------

    @staticmethod
    def _stop_replica(r: Replica) -> None:
        stop_process(r.sidecar, grace_s=5.0)
        r.twin.stop()

    def stop(self) -> None:
        try:
            self._stack.close()
            self.receiver.close()  # bound when made: a fleet refused before its start holds it
        finally:
            # side by side: each twin may take seconds to shut its engine down
            stoppers = [threading.Thread(target=self._stop_replica, args=(r,))
                        for r in self.replicas]  # fmt: skip
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join()
            self.replicas = []
            if self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            restore_sigterm(self._sigterm_before)
            self._sigterm_before = None
