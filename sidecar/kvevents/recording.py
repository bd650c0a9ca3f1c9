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

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["MAGIC", "RecordingError", "write_frame", "read_frames"]

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


def read_frames(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """The (sequence, payload) pairs in order, and how many bytes at the end were cut off."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RecordingError(f"cannot read {path}: {e.strerror or e}") from None
    if not data.startswith(MAGIC):
        raise RecordingError(f"{path} is not a kvwatch KV event recording")
    frames = list(_frames(data))
    used = len(MAGIC) + sum(_HEAD.size + len(p) for _, p in frames)
    return frames, len(data) - used


def _frames(data: bytes) -> Iterator[tuple[int, bytes]]:
    at = len(MAGIC)
    while at + _HEAD.size <= len(data):
        seq, n = _HEAD.unpack_from(data, at)
        if n > MAX_PAYLOAD or at + _HEAD.size + n > len(data):
            return
        at += _HEAD.size
        yield seq, data[at : at + n]
        at += n
