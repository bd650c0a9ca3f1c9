from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvwatch.sidecar.logs.follow import (
    FileFollower,
    FollowStats,
    LineSplitter,
    read_stream,
    run_and_read,
)


class TestLineSplitter:
    def test_lines_across_chunks(self) -> None:
        sp = LineSplitter(FollowStats())
        assert sp.feed(b"ab") == []
        assert sp.feed(b"c\nd\ne") == ["abc", "d"]
        assert sp.flush() == ["e"]

    def test_overlong_line_is_dropped_and_counted(self) -> None:
        stats = FollowStats()
        sp = LineSplitter(stats, max_line=100)
        out = sp.feed(b"ok\n" + b"x" * 10_000_000)
        out += sp.feed(b"y" * 1000 + b"\nafter\n")
        assert out == ["ok", "after"]
        assert stats.oversized_lines == 1 and stats.lines == 2

    def test_binary_bytes_are_replaced(self) -> None:
        sp = LineSplitter(FollowStats())
        (line,) = sp.feed(b"\xff\xfe\x00abc\n")
        assert line.endswith("abc") and "\ufffd" in line


class TestFileFollower:
    def test_appears_later_grows_rotates_truncates(self, tmp_path: Path) -> None:
        path = tmp_path / "vllm.log"
        f = FileFollower(path)
        assert f.poll() == [] and f.stats.missing
        path.write_text("one\ntw")
        assert f.poll() == ["one"]
        with path.open("a") as fh:
            fh.write("o\nthree\n")
        assert f.poll() == ["two", "three"]
        # rotation: rename away, unread tail of the old file still comes through
        with path.open("a") as fh:
            fh.write("last of old\n")
        os.rename(path, tmp_path / "vllm.log.1")
        path.write_text("new one\n")
        assert f.poll() == ["last of old", "new one"]
        assert f.stats.rotations == 1
        # truncation in place (copytruncate)
        path.write_text("")
        f.poll()
        path.write_text("fresh\n")
        assert f.poll() == ["fresh"]
        assert f.stats.truncations == 1
        f.close()

    def test_copytruncate_then_a_burst_past_the_old_offset(self, tmp_path: Path) -> None:
        """logrotate's copytruncate, and 250 lines written before the next poll: the size is
        past the old offset again, so only the content tells (issue 13: 196 of 250 read)."""
        path = tmp_path / "vllm.log"
        path.write_text("".join(f"INFO old line {i}\n" for i in range(100)))
        f = FileFollower(path)
        assert len(f.poll()) == 100
        path.write_text("".join(f"INFO new line {i:04d}\n" for i in range(250)))
        got = f.poll()
        assert got == [f"INFO new line {i:04d}" for i in range(250)]
        assert f.stats.truncations == 1
        with path.open("a") as fh:
            fh.write("INFO after\n")
        assert f.poll() == ["INFO after"] and f.stats.truncations == 1
        f.close()

    def test_from_end_skips_history(self, tmp_path: Path) -> None:
        path = tmp_path / "vllm.log"
        path.write_text("old\n")
        f = FileFollower(path, from_start=False)
        assert f.poll() == []
        with path.open("a") as fh:
            fh.write("new\n")
        assert f.poll() == ["new"]
        f.close()


class TestStreams:
    def test_read_stream_echoes_bytes_unchanged(self, tmp_path: Path) -> None:
        src = tmp_path / "in"
        payload = b"a\n\xffb\nno newline"
        src.write_bytes(payload)
        echo = tmp_path / "echo"
        got: list[str] = []
        with src.open("rb") as fin, echo.open("wb") as fout:
            read_stream(fin, got.extend, FollowStats(), echo=fout)
        assert echo.read_bytes() == payload
        assert got == ["a", "\ufffdb", "no newline"]

    def test_run_and_read_merges_stdout_and_stderr(self, tmp_path: Path) -> None:
        got: list[str] = []
        lock = threading.Lock()

        def sink(lines: list[str]) -> None:
            with lock:
                got.extend(lines)

        out = tmp_path / "out"
        code = "import sys; print('to out', flush=True); print('to err', file=sys.stderr)"
        with out.open("wb") as echo:
            proc, thread = run_and_read([sys.executable, "-c", code], sink, FollowStats(), echo)
            assert proc.wait(timeout=30) == 0
            thread.join(10)
        assert sorted(got) == ["to err", "to out"]
        assert sorted(out.read_bytes().splitlines()) == [b"to err", b"to out"]
        assert isinstance(proc, subprocess.Popen)


def test_a_stopped_command_leaves_none_of_its_children() -> None:
    """`kvwatch sidecar -- vllm serve`: vLLM's EngineCore is the command's child. One that
    outlives its parent's SIGTERM (here: ignores it) is killed with the command's group."""
    from kvwatch.sidecar.daemon import stop_command

    sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))
    from procfs import running

    code = (
        "import signal, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
        "print(kid.pid, flush=True)\n"
        "time.sleep(300)\n"
    )  # fmt: skip
    got: list[str] = []
    proc, thread = run_and_read([sys.executable, "-c", code], got.extend, FollowStats(), None)
    try:
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        kid = int(got[0])
        assert os.getpgid(kid) == proc.pid  # the command's own group, not the sidecar's
        assert asyncio.run(stop_command(proc, 0, wait_s=10, group_wait_s=0.5)) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while running(kid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(kid), "the command's child outlived it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        thread.join(10)
