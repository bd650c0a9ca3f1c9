"""The local vLLM target: every failure to start is clean. (It preempts under load: the same
32 x 300-token burst as tests/loadgen/test_loadgen_live.py's thrashing run, which checks it.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.local.server import (
    LocalVLLM,
    ServerConfig,
    ServerStartError,
    free_port,
    group_alive,
    set_autogroup_nice,
)

pytestmark = pytest.mark.integration


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
