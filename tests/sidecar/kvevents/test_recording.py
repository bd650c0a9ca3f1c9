"""A run's KV event recording: written as batches came, read back through the wire's checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from kvwatch.loadgen.results.kv_events import curve_from_recording
from kvwatch.sidecar.kvevents.recording import (
    MAGIC,
    Frames,
    RecordingError,
    read_frames,
    write_frame,
)


def _stored(*hashes: int, parent: int | None = None, ts: float = 1.7e9) -> bytes:
    return msgspec.msgpack.encode([ts, [{"type": "BlockStored", "block_hashes": list(hashes),
                                            "parent_block_hash": parent, "token_ids": [1] * 16,
                                            "block_size": 16}], None])  # fmt: skip


def _write(path: Path, frames: list[tuple[int, bytes]]) -> None:
    with path.open("wb") as f:
        for seq, payload in frames:
            write_frame(f, seq, payload)


def test_frames_back_in_order_and_a_cut_end_counted(tmp_path: Path) -> None:
    path = tmp_path / "kv_events.bin"
    frames = [(0, _stored(1, 2)), (1, _stored(3, parent=2)), (2, _stored(9))]
    _write(path, frames)
    assert read_frames(path) == (frames, 0)
    path.write_bytes(path.read_bytes()[:-5])  # a run killed mid-write
    got, cut = read_frames(path)
    assert got == frames[:2] and cut == 8 + 4 + len(frames[2][1]) - 5


def test_a_recording_streams_and_a_length_past_the_bound_ends_it(tmp_path: Path) -> None:
    path = tmp_path / "kv_events.bin"
    _write(path, [(0, _stored(1)), (1, _stored(2))])
    whole = path.read_bytes()
    # a header that claims more than any batch may carry (a flipped byte): the rest is cut
    path.write_bytes(whole + (2).to_bytes(8, "big") + (1 << 30).to_bytes(4, "big") + b"x" * 9)
    frames = Frames(path)
    it = iter(frames)
    assert next(it)[0] == 0  # one batch in hand, the rest of the file not read
    assert [seq for seq, _ in it] == [1] and frames.cut == 8 + 4 + 9


def test_the_curve_from_a_recording_says_what_it_left_out(tmp_path: Path) -> None:
    path = tmp_path / "kv_events.bin"
    # blocks 1-2 stored, read again by a request 30 s later (its new block 5 hangs off 2), a
    # batch lost (seq 3), one that is not a batch, then the server started again (seq back to 0)
    _write(path, [(0, _stored(1, 2)), (1, _stored(5, parent=2, ts=1.7e9 + 30)), (2, b"\xc1"),
                  (4, _stored(7)), (0, _stored(8))])  # fmt: skip
    curve, notes = curve_from_recording(path, 40)
    assert curve is not None and curve.source == "parent chains"
    # reads counted: 1, 2 (cold), 1, 2 (hits), 5, 7, 8 (cold): 2 hits of 7
    assert curve.ideal == pytest.approx(2 / 7)
    assert notes == [
        "kv_events.bin: 1 batches lost during the run",
        "kv_events.bin: 1 batches that are not KV events left out",
        "kv_events.bin: the server restarted 1 times",
    ]


@pytest.mark.parametrize("data", [b"", b"KVWEV0\n\0", b"{}"])
def test_what_is_not_a_recording_is_refused_in_one_line(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "kv_events.bin"
    path.write_bytes(data)
    with pytest.raises(RecordingError, match="not a kvwatch KV event recording"):
        read_frames(path)
    assert MAGIC.startswith(b"KVWEV1")


def test_loadgen_refuses_an_endpoint_it_cannot_follow() -> None:
    p = subprocess.run([sys.executable, "-m", "kvwatch", "loadgen", "run", "--url",
                        "http://127.0.0.1:9", "--kv-events", "tcp://*:5557"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and "give tcp://HOST:PORT" in p.stderr
