"""The local vLLM target: it preempts under load, and every failure to start is clean."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from kvwatch.local.server import (
    LocalVLLM,
    ServerConfig,
    ServerStartError,
    free_port,
    group_alive,
    set_autogroup_nice,
)
from kvwatch.sidecar.contract.vocabulary import KV_USAGE, PREEMPTIONS
from kvwatch.sidecar.metrics.exposition import parse_exposition
from tests.burst import run_burst

pytestmark = pytest.mark.integration


def _read(base_url: str, client: httpx.Client | None = None) -> tuple[float, float]:
    """(preemptions so far, KV usage now) from the server's real /metrics."""
    text = (client or httpx).get(base_url + "/metrics", timeout=10).text
    exp = parse_exposition(text)
    return exp.family(PREEMPTIONS)[0].value, exp.family(KV_USAGE)[0].value


_AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _skip_without_autogroups() -> None:
    """Skip only on a kernel built without autogroups (no sysctl for them): where they exist,
    enabled or not, each process has its autogroup file and the check runs."""
    if not _AUTOGROUPS.exists():
        pytest.skip("this kernel is built without autogroups (no sched_autogroup_enabled)")


def test_the_server_session_is_niced_as_a_group() -> None:
    """With autogroups, a nice value counts only inside its session: the server's session
    (its own, to be stopped as a group) is niced too."""
    import subprocess

    _skip_without_autogroups()
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert set_autogroup_nice(child.pid, 7)
        assert Path(f"/proc/{child.pid}/autogroup").read_text().split()[-1] == "7"
    finally:
        child.kill()
        child.wait()
    assert not set_autogroup_nice(child.pid, 7)  # gone: said, not raised


class TestLocalVLLM:
    def test_the_fixture_server_session_is_niced(self, vllm_server: LocalVLLM) -> None:
        # the session fixture runs at nice 10 (tests/conftest.py); without its autogroup niced
        # the observers starved for seconds
        _skip_without_autogroups()
        group = Path(f"/proc/{vllm_server.pid}/autogroup")
        assert group.read_text().split()[-1] == "10"

    def test_concurrent_streams_preempt(self, vllm_server: LocalVLLM) -> None:
        before, _ = _read(vllm_server.base_url)
        peak = 0.0
        stop = threading.Event()

        def poll() -> None:
            nonlocal peak
            with httpx.Client() as client:  # one client: a new one per poll costs CPU
                while not stop.is_set():
                    peak = max(peak, _read(vllm_server.base_url, client)[1])
                    time.sleep(0.1)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            records = asyncio.run(run_burst(vllm_server.base_url, n=32, max_tokens=300, seed=1))
        finally:
            stop.set()
            poller.join()
        after, _ = _read(vllm_server.base_url)
        assert all(r.ok for r in records), [r.error for r in records if not r.ok]
        assert [r.output_tokens for r in records] == [300] * 32
        assert after > before, "no preemption under 32 concurrent streams"
        assert peak >= 0.9, f"KV usage peaked at {peak:.2f}"

    def test_bad_model_dir(self, tmp_path: Path) -> None:
        srv = LocalVLLM(ServerConfig(model=tmp_path / "nope"), log_path=tmp_path / "log")
        with pytest.raises(ServerStartError, match="does not exist"):
            srv.start()
        (tmp_path / "empty").mkdir()
        srv = LocalVLLM(ServerConfig(model=tmp_path / "empty"), log_path=tmp_path / "log")
        with pytest.raises(ServerStartError, match="lacks config.json"):
            srv.start()
        assert srv.proc is None

    def test_port_in_use(self, vllm_server: LocalVLLM, tiny_model: Path, tmp_path: Path) -> None:
        cfg = ServerConfig(model=tiny_model, port=vllm_server.port)
        with pytest.raises(ServerStartError, match="already in use"):
            LocalVLLM(cfg, log_path=tmp_path / "log").start()

    def test_dies_during_start_leaves_nothing(self, tiny_model: Path, tmp_path: Path) -> None:
        # A KV budget too small for one max-length sequence: vLLM loads, then exits with an error.
        cfg = ServerConfig(model=tiny_model, kv_cache_memory_bytes=64 * 1024, port=free_port())
        srv = LocalVLLM(cfg, log_path=tmp_path / "vllm.log")
        pids: list[int] = []
        orig = srv._wait_ready

        def spy() -> None:
            assert srv.proc is not None
            pids.append(srv.proc.pid)
            orig()

        srv._wait_ready = spy  # type: ignore[method-assign]
        with pytest.raises(ServerStartError, match="exited with code") as info:
            srv.start()
        # one line naming the log (vLLM's traceback was 40 lines of it); the tail is kept
        assert "its log:" in str(info.value) and len(str(info.value).splitlines()) == 1
        assert len(info.value.tail.splitlines()) > 2
        assert pids and not group_alive(pids[0])
