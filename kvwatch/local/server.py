"""Start and stop a local vLLM OpenAI server: the target the load generator drives.

The server runs in its own process group so that stopping it also stops vLLM's EngineCore and
worker children; nothing is left behind, even when start-up fails half way.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

__all__ = [
    "ServerConfig",
    "LocalVLLM",
    "ServerStartError",
    "last_error",
    "free_port",
    "wait_until_ok",
    "stop_process",
    "sigterm_interrupts",
    "restore_sigterm",
    "port_is_free",
    "group_alive",
    "set_autogroup_nice",
    "serve_until_stopped",
]

# 40 blocks of 32 tokens with the tiny model's 8 KiB per token: small enough that 32 concurrent
# 300-token streams must preempt.
DEFAULT_KV_CACHE_BYTES = 10 * 1024 * 1024
DEFAULT_BLOCK_SIZE = 32  # CPU backend wants a multiple of 32
_LOG_TAIL_LINES = 40
_KILL_WAIT_S = 5.0


class ServerStartError(RuntimeError):
    """The server could not be started: the message says why in one line (with the log's last
    error, not vLLM's 40-line traceback); `tail` keeps the log's last lines."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Exit)\b:?")
_LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s+(?:\w+\s+\d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")


def last_error(tail: str) -> str | None:
    """The last line of a log's tail that names an exception (what vLLM died of), without the
    process and time prefix; None when none does."""
    for line in reversed(tail.splitlines()):
        said = _LOG_PREFIX.sub("", line.strip())
        # the API server's own last words point back at the engine's; a traceback's source
        # line (`raise RuntimeError(`) names the exception but says nothing of why
        if (
            _ERROR_LINE.search(said)
            and "root cause above" not in said
            and not said.startswith(("raise ", "File "))
        ):
            return said[:300]
    return None


# Ports free_port has handed out in this process. The kernel can give bind(0) a port it gave a
# moment ago and that is closed again; a fleet starts replicas, their sidecars and their vLLM
# processes side by side, and a start was lost to "already in use" (2 in about 10 fleet runs).
_HANDED: set[int] = set()
_HANDED_LOCK = threading.Lock()


def _bound_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, never one this process handed out before. Probed once more
    after the kernel offers it: another process choosing the same way (a vLLM starting beside
    this one binds its own ports) can take the offered port first."""
    with _HANDED_LOCK:
        for _ in range(100):
            port = _bound_port(host)
            if port not in _HANDED and port_is_free(port, host):
                break
        _HANDED.add(port)
    return port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True unless something listens there. SO_REUSEADDR as servers set it: TIME_WAIT is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class ServerConfig:
    """What the server is started with. `extra_args` go to vLLM verbatim (e.g. --max-num-seqs)."""

    model: Path
    # None leaves the setting to vLLM (the twin sizes like a GPU from --gpu-memory-utilization)
    kv_cache_memory_bytes: int | None = DEFAULT_KV_CACHE_BYTES
    block_size: int | None = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = 1024
    host: str = "127.0.0.1"
    port: int | None = None
    served_model_name: str | None = None
    stats_interval_s: float = 1.0
    # CPU priority (nice value) of the server and its engine process, and of its session's
    # autogroup (`set_autogroup_nice`). On a small machine the server stands in for a GPU one
    # and competes for the CPUs with the observers (sidecar, load generator); a positive value
    # keeps them from being starved into sampling only the server's idle moments.
    nice: int = 0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # the Python that has vLLM (another release's venv, say); None: this one
    python: str | None = None
    # a model directory with no weights (the twin builds the model on the meta device)
    weightless: bool = False

    def command(self, port: int) -> list[str]:
        cmd = [
            self.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--host", self.host,
            "--port", str(port),
            "--dtype", "bfloat16",
            "-O0",
        ]  # fmt: skip
        for flag, value in (
            ("--max-model-len", self.max_model_len),
            ("--block-size", self.block_size),
            ("--kv-cache-memory-bytes", self.kv_cache_memory_bytes),
        ):
            if value is not None:
                cmd += [flag, str(value)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        cmd += list(self.extra_args)
        return ["nice", "-n", str(self.nice), *cmd] if self.nice else cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_LOG_STATS_INTERVAL=f"{self.stats_interval_s:g}",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        return env


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Give the session `pid` leads the nice value too. With the kernel's autogroups on
    (`/proc/sys/kernel/sched_autogroup_enabled`), each session is its own scheduling group and a
    process's nice value only counts against its own session: a server started in a new
    session at `nice 10` still took half the CPUs from the observers, and stalled a nice-0
    process for 3.7 s (its 10 ms sleeps; 2.4 ms at most with the group niced). False where
    there are no autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        return False
    return True


def _check_model_dir(model: Path, weightless: bool = False) -> None:
    try:
        _check_model_files(model, weightless)
    except (OSError, ValueError) as e:  # a name too long, a NUL: not a model directory either
        raise ServerStartError(f"model directory {str(model)[:200]}: {e}") from None


def _check_model_files(model: Path, weightless: bool) -> None:
    if not model.is_dir():
        raise ServerStartError(f"model directory {model} does not exist")
    missing = [n for n in ("config.json", "tokenizer.json") if not (model / n).is_file()]
    if missing:
        raise ServerStartError(f"model directory {model} lacks {', '.join(missing)}")
    if not weightless and not any(model.glob("*.safetensors")):
        raise ServerStartError(f"model directory {model} has no *.safetensors weights")


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :]
    except OSError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class LocalVLLM:
    """A vLLM OpenAI server on this machine, as a context manager.

    >>> with LocalVLLM(ServerConfig(model=path), log_path=Path("vllm.log")) as srv:
    ...     httpx.get(srv.base_url + "/v1/models")
    """

    def __init__(
        self,
        config: ServerConfig,
        log_path: Path,
        start_timeout_s: float = 180.0,
        stop_grace_s: float = 15.0,
        cancel: threading.Event | None = None,
    ) -> None:
        """`cancel`: set from another thread, it ends a start still waiting for readiness
        (ServerStartError; the process stopped), as a fleet does on Ctrl-C."""
        self.config = config
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.cancel = cancel
        self.stop_grace_s = stop_grace_s
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0  # where this start's lines begin: the log is appended to
        self._sigterm_before: signal._HANDLER | None = None  # see sigterm_interrupts
        self._rpc_dir: str | None = None  # see _environment

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> LocalVLLM:
        _check_model_dir(self.config.model, self.config.weightless)
        port = self.config.port or free_port(self.config.host)
        if not port_is_free(port, self.config.host):
            raise ServerStartError(f"port {port} on {self.config.host} is already in use")
        self.port = port
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            try:
                self.proc = subprocess.Popen(
                    self.config.command(port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self._environment(),
                    start_new_session=True,
                )
            except BaseException:
                self._remove_rpc_dir()
                raise
        if self.config.nice:
            set_autogroup_nice(self.proc.pid, self.config.nice)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _environment(self) -> dict[str, str]:
        """The config's environment, with vLLM's ZMQ sockets in a folder of this start's own
        (VLLM_RPC_BASE_PATH, unless the caller chose one): vLLM makes them in the temp folder
        by default and a killed server leaves them there; 450 were left in /tmp by a day of
        this project's tests (2026-12-07). `stop` removes the folder."""
        env = self.config.environment()
        if "VLLM_RPC_BASE_PATH" not in env:
            self._rpc_dir = env["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="kvwatch-rpc-")
        return env

    def _remove_rpc_dir(self) -> None:
        if self._rpc_dir is not None:
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._rpc_dir = None

    def _wait_ready(self) -> None:
        assert self.proc is not None
        if wait_until_ok(self.base_url + "/health", self.proc, self.start_timeout_s, self.cancel):
            return
        if self.cancel is not None and self.cancel.is_set():
            raise ServerStartError("the start was cancelled")
        code = self.proc.poll()
        why = (
            f"vLLM exited with code {code} during start"
            if code is not None
            else f"vLLM not ready after {self.start_timeout_s:.0f} s"
        )
        tail = _tail(self.log_path)
        said = last_error(tail)
        raise ServerStartError(
            f"{why}" + (f" ({said})" if said else "") + f"; its log: {self.log_path}", tail
        )

    def stop(self, first_signal: int = signal.SIGTERM) -> int | None:
        """SIGTERM the process group, wait, then SIGKILL what is left. Returns the exit code.
        With `first_signal` SIGKILL, a crash: nothing of it gets to shut down in order."""
        proc = self.proc
        if proc is None:
            self._remove_rpc_dir()
            return None
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, first_signal)
        try:
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        # Children (EngineCore, workers) may outlive the leader for a moment.
        deadline = time.monotonic() + self.stop_grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + _KILL_WAIT_S
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.proc = None
        self._remove_rpc_dir()
        return proc.returncode

    def __enter__(self) -> LocalVLLM:
        self._sigterm_before = sigterm_interrupts()
        try:
            return self.start()
        except BaseException:
            restore_sigterm(self._sigterm_before)
            raise

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            restore_sigterm(self._sigterm_before)


def sigterm_interrupts() -> signal._HANDLER | None:
    """While a `with LocalVLLM(...)` runs, a SIGTERM to this process interrupts it like Ctrl-C,
    so the `with` exits and stops the server: by default SIGTERM ends Python at once and the
    server (in a session of its own) lives on. Only in the main thread, and only where nobody
    set a handler: the old one, or None where it was left alone."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, signal.default_int_handler)


def restore_sigterm(before: signal._HANDLER | None) -> None:
    if before is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, before)


def wait_until_ok(
    url: str,
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    cancel: threading.Event | None = None,
    period_s: float = 0.2,
) -> bool:
    """Polls `url` until it answers 200 (True), or until the process exits, the time is up or
    `cancel` is set (False): the readiness check of every process kvwatch starts."""
    deadline = time.monotonic() + timeout_s
    stop = cancel or threading.Event()  # a wait on it is the poll's sleep
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            if stop.wait(period_s):
                return False


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> int:
    """SIGTERM, wait up to `grace_s`, then SIGKILL (for single processes; a vLLM server's
    process group is stopped by LocalVLLM.stop)."""
    proc.terminate()
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of ours are reaped by wait())."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve_until_stopped(server: LocalVLLM, lines: tuple[str, ...] = ()) -> None:
    """What `serve-local` and `kvwatch twin` do once vLLM is up: print `base_url=`, `log=`,
    `pid=` and `lines`, hold until Ctrl-C (or a SIGTERM the caller made interrupt), then stop
    the server. ServerStartError if vLLM exits on its own meanwhile."""
    try:
        print(f"base_url={server.base_url}")
        print(f"log={server.log_path}")
        print(f"pid={server.pid}")
        for line in lines:
            print(line)
        sys.stdout.flush()
        while True:
            time.sleep(0.5)
            proc = server.proc
            if proc is not None and proc.poll() is not None:
                raise ServerStartError(
                    f"vLLM exited with code {proc.returncode}; see {server.log_path}"
                )
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping vLLM ...", file=sys.stderr)
        server.stop()
