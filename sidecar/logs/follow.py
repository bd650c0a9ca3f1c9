"""Read log lines from a file (like `tail -F`), a stream (stdin), or a command kvwatch starts.

All three share one line splitter, which caps line length: a 10 MB line of garbage costs one
counted "oversized" line, not 10 MB of memory. Bytes that are not UTF-8 are replaced, not fatal.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

__all__ = [
    "LineSplitter",
    "FollowStats",
    "FileFollower",
    "read_stream",
    "read_line_chunks",
    "run_and_read",
]

DEFAULT_MAX_LINE = 64 * 1024
_CHUNK = 1 << 20
_TAIL_BYTES = 64

LineSink = Callable[[list[str]], None]


@dataclass
class FollowStats:
    lines: int = 0
    bytes: int = 0
    oversized_lines: int = 0
    rotations: int = 0
    truncations: int = 0
    missing: bool = False  # the followed file does not exist (yet)


class LineSplitter:
    """Turns byte chunks into complete decoded lines, dropping the rest of any overlong line."""

    def __init__(self, stats: FollowStats, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.stats = stats
        self.max_line = max_line
        self._partial = b""
        self._skipping = False  # inside an overlong line, until its newline

    def feed(self, chunk: bytes) -> list[str]:
        self.stats.bytes += len(chunk)
        parts = chunk.split(b"\n")
        tail = parts.pop()
        out: list[str] = []
        for i, part in enumerate(parts):
            if i == 0:
                if self._skipping:
                    self._skipping = False
                    continue
                part = self._partial + part
                self._partial = b""
            if len(part) > self.max_line:
                self.stats.oversized_lines += 1
                continue
            out.append(part.decode("utf-8", "replace"))
        if parts:
            self._partial = tail
        elif not self._skipping:
            self._partial += tail
        if not self._skipping and len(self._partial) > self.max_line:
            self.stats.oversized_lines += 1
            self._partial = b""
            self._skipping = True
        self.stats.lines += len(out)
        return out

    def flush(self) -> list[str]:
        """The last line when the input ended without a newline."""
        rest, self._partial = self._partial, b""
        if not rest or self._skipping:
            return []
        self.stats.lines += 1
        return [rest.decode("utf-8", "replace")]


def read_line_chunks(fh: BinaryIO, stats: FollowStats) -> Iterator[str]:
    """A whole file as text chunks of complete lines, through the one splitter: memory stays
    bounded by a chunk and a line, whatever the file (a file with no newline at all is one
    oversized line, counted)."""
    splitter = LineSplitter(stats)
    while chunk := fh.read(_CHUNK):
        if lines := splitter.feed(chunk):
            yield "\n".join(lines) + "\n"
    if rest := splitter.flush():
        yield rest[0] + "\n"


class FileFollower:
    """Follows a path across rotation (new inode), truncation, and a file that appears later.

    `poll()` returns the complete lines added since the last call; it never blocks. Truncation
    is told by content, not only size: the bytes just before the read offset must still be the
    ones read there, so a copytruncate followed by a burst past the old offset before the next
    poll is caught too.
    """

    def __init__(
        self, path: Path, from_start: bool = True, max_line: int = DEFAULT_MAX_LINE
    ) -> None:
        self.path = path
        self.stats = FollowStats()
        self._split = LineSplitter(self.stats, max_line)
        self._fh: BinaryIO | None = None
        self._inode: int | None = None
        self._from_start = from_start
        self._tail = b""  # the last bytes read, ending at the read offset

    def _open(self, at_end: bool) -> None:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (kept open across polls)
        except OSError:
            self.stats.missing = True
            return
        self.stats.missing = False
        st = os.fstat(fh.fileno())
        self._fh, self._inode, self._tail = fh, st.st_ino, b""
        if at_end:
            fh.seek(0, os.SEEK_END)
            self._tail = self._read_back(fh.tell())

    def _read_back(self, end: int) -> bytes:
        assert self._fh is not None
        start = max(0, end - _TAIL_BYTES)
        return os.pread(self._fh.fileno(), end - start, start)

    def _rewritten(self) -> bool:
        """Whether the file no longer holds, just before the offset, what was read there."""
        assert self._fh is not None
        return bool(self._tail) and self._read_back(self._fh.tell()) != self._tail

    def _drain(self) -> list[str]:
        assert self._fh is not None
        out: list[str] = []
        while chunk := self._fh.read(_CHUNK):
            out += self._split.feed(chunk)
            self._tail = (self._tail + chunk)[-_TAIL_BYTES:]
        return out

    def _restart_at_zero(self) -> list[str]:
        assert self._fh is not None
        self.stats.truncations += 1
        self._split.flush()  # a cut line of the old content is dropped
        self._fh.seek(0)
        self._tail = b""
        return self._drain()

    def poll(self) -> list[str]:
        if self._fh is None:
            self._open(at_end=not self._from_start)
            self._from_start = True  # a file that appears later is read from its start
            if self._fh is None:
                return []
        if self._rewritten():
            return self._restart_at_zero()
        out = self._drain()
        try:
            st = os.stat(self.path)
        except OSError:
            return out  # rotated away; keep the old handle until a new file appears
        if st.st_ino != self._inode:
            self.stats.rotations += 1
            out += self._drain() + self._split.flush()
            self.close()
            self._open(at_end=False)
            if self._fh is not None:
                out += self._drain()
        elif st.st_size < self._fh.tell():
            out += self._restart_at_zero()
        return out

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_stream(
    stream: IO[bytes],
    sink: LineSink,
    stats: FollowStats,
    echo: BinaryIO | None = None,
    max_line: int = DEFAULT_MAX_LINE,
) -> None:
    """Read a byte stream to its end, passing lines to `sink` (and bytes to `echo` unchanged)."""
    split = LineSplitter(stats, max_line)
    fd = stream.fileno()
    while chunk := os.read(fd, 65536):
        if echo is not None:
            echo.write(chunk)
            echo.flush()
        lines = split.feed(chunk)
        if lines:
            sink(lines)
    last = split.flush()
    if last:
        sink(last)


def run_and_read(
    command: Sequence[str],
    sink: LineSink,
    stats: FollowStats,
    echo: BinaryIO | None = None,
) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """Start `command` with stdout and stderr merged into one pipe and read it in a thread.

    The output goes on to `echo` (our stdout) byte for byte, so wrapping vLLM in the sidecar
    changes nothing in what its own log collector sees. The command runs in a session (and
    process group) of its own, whose id is its PID: vLLM's EngineCore and workers are its
    children, and the sidecar stops what is left of them by the group (daemon.stop_command).
    """
    proc = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    pipe = proc.stdout
    assert pipe is not None

    def pump() -> None:
        with pipe:
            read_stream(pipe, sink, stats, echo)

    thread = threading.Thread(target=pump, name="vllm-output", daemon=True)
    thread.start()
    return proc, thread
