"""A server's KV event batches kept in a file, as they came: a load run's `kv_events.bin`.

`kvwatch loadgen run --kv-events ENDPOINT` writes every message's sequence number and payload
(vLLM's msgpack, untouched) while the load runs; `kvwatch advise --run DIR` reads them back
through the same checks the sidecar applies on the wire (wire.py) and draws the same curve.

The file: the 8 bytes `KVWEV1\\n\\0`, then per batch its sequence number (8 bytes, big-endian),
its payload's length (4 bytes) and the payload. A file cut short (a run killed mid-write) is
read up to its last whole batch, and the cut is counted; a file that does not start with the
magic is refused in one line.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["MAGIC", "RecordingError", "Frames", "write_frame", "read_frames"]

MAGIC = b"KVWEV1\n\0"
_HEAD = struct.Struct(">QI")
MAX_PAYLOAD = 64 << 20  # one batch; vLLM's are KBs (a step's stores and removals)


class RecordingError(ValueError):
    """A file that is not a KV event recording; one line."""


def write_frame(f: BinaryIO, seq: int, payload: bytes) -> None:
    if f.tell() == 0:
        f.write(MAGIC)
    f.write(_HEAD.pack(seq, len(payload)))
    f.write(payload)


class Frames:
    """A recording's (sequence, payload) pairs, read one at a time as they are iterated (a
    10-minute run at 256 requests records about 60 MB); `cut` counts the bytes after the last
    whole batch once they were. The magic is checked on opening (RecordingError)."""

    def __init__(self, path: Path) -> None:
        try:
            with path.open("rb") as f:
                head = f.read(len(MAGIC))
                self.size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise RecordingError(f"cannot read {path}: {e.strerror or e}") from None
        if head != MAGIC:
            raise RecordingError(f"{path} is not a kvwatch KV event recording")
        self.path = path
        self.cut = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        try:
            with self.path.open("rb") as f:
                f.seek(len(MAGIC))
                yield from self._frames(f)
        except OSError as e:
            raise RecordingError(f"cannot read {self.path}: {e.strerror or e}") from None

    def _frames(self, f: BinaryIO) -> Iterator[tuple[int, bytes]]:
        self.cut = 0
        while True:
            at = f.tell()
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                self.cut = len(head)
                return
            seq, n = _HEAD.unpack(head)
            payload = f.read(n) if n <= MAX_PAYLOAD else b""
            if n > MAX_PAYLOAD or len(payload) < n:
                self.cut = max(0, self.size - at)
                return
            yield seq, payload


def read_frames(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """All the (sequence, payload) pairs in order, and how many bytes at the end were cut off
    (for a recording small enough to hold; `Frames` streams one)."""
    frames = Frames(path)
    got = list(frames)
    return got, frames.cut
