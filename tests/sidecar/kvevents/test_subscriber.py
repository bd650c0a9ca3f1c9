"""The KV event feed against vLLM's own publisher (`ZmqEventPublisher`, in this process): in
order, across a gap (replayed, or missed past the publisher's buffer), across a publisher that
starts again, and beside a publisher of garbage (a raw ZMQ socket: no real part sends that)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvwatch.sidecar.kvevents.subscriber import KvEventFeed
from kvwatch.sidecar.kvevents.wire import Batch, Stored, block_key

pytestmark = pytest.mark.integration  # imports vLLM

DEADLINE_S = 20.0


def _until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never: {what}")
        time.sleep(0.02)


def _batch(*hashes: int) -> object:
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    stored = BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[1] * 16,
                         block_size=16, lora_id=None, medium="GPU", lora_name=None)  # fmt: skip
    return KVEventBatch(ts=time.time(), events=[stored])


_NAME = {block_key(0, h): h for h in range(10_000)}  # a block key: its hash


class _Got:
    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.restarts = 0

    def hashes(self) -> list[int]:
        """The hashes the batches stored, in order; a probe's (10,000 and up) as 10**9."""
        return [
            _NAME.get(k, 10**9)
            for b in self.batches
            for e in b.events
            if isinstance(e, Stored)
            for k in e.keys
        ]


@contextmanager
def _following(feed: KvEventFeed) -> Iterator[None]:
    stop = threading.Event()
    th = threading.Thread(target=feed.run, args=(stop,), daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(5)
    # the loop gives up a receive after 200 ms to look at `stop`: a receive that blocked
    # without a timeout would leave it running
    assert not th.is_alive(), "the feed did not stop within 5 s of being asked"


def _publisher(tmp: Path, buffer_steps: int = 100) -> object:
    from vllm.distributed.kv_events import ZmqEventPublisher

    return ZmqEventPublisher(0, endpoint=f"ipc://{tmp}/pub", replay_endpoint=f"ipc://{tmp}/replay",
                             buffer_steps=buffer_steps)  # fmt: skip


def _connected(pub: object, got: _Got) -> None:
    """ZMQ's slow joiner: publish until the subscriber has one (each a batch of its own)."""
    n = len(got.batches)
    i = 10_000
    while len(got.batches) == n:
        pub.publish(_batch(i))  # type: ignore[attr-defined]
        i += 1
        time.sleep(0.05)


def _feed(tmp: Path, got: _Got) -> KvEventFeed:
    """A feed of the publisher in `tmp`, with its replay endpoint, into `got`."""

    def restarted() -> None:
        got.restarts += 1

    return KvEventFeed(f"ipc://{tmp}/pub", got.batches.append, restarted, f"ipc://{tmp}/replay")


def test_in_order_then_a_gap_replayed(tmp_path: Path) -> None:
    pub = _publisher(tmp_path)
    got = _Got()
    feed = _feed(tmp_path, got)
    try:
        with _following(feed):
            _connected(pub, got)
            for h in (1, 2, 3):
                pub.publish(_batch(h))  # type: ignore[attr-defined]
            _until(lambda: got.hashes()[-3:] == [1, 2, 3], "three batches in order")
        for h in (4, 5, 6, 7):  # while nobody listens
            pub.publish(_batch(h))  # type: ignore[attr-defined]
        time.sleep(0.3)
        with _following(feed):
            _connected(pub, got)
            _until(lambda: feed.stats.replayed >= 4, "the gap replayed")
        assert [h for h in got.hashes() if h < 10_000] == [1, 2, 3, 4, 5, 6, 7]
        assert feed.stats.missed == 0 and feed.stats.refused == 0 and got.restarts == 0
    finally:
        pub.shutdown()  # type: ignore[attr-defined]


def test_a_gap_past_the_buffer_is_missed_and_a_restart_is_said(tmp_path: Path) -> None:
    pub = _publisher(tmp_path, buffer_steps=2)
    got = _Got()
    feed = _feed(tmp_path, got)
    try:
        with _following(feed):
            _connected(pub, got)
        for h in (4, 5, 6, 7, 8):
            pub.publish(_batch(h))  # type: ignore[attr-defined]
        time.sleep(0.3)
        with _following(feed):
            _connected(pub, got)
            _until(lambda: feed.stats.missed > 0, "the batches past the buffer counted")
        # the buffer holds two: at most 8 and a probe batch when the first one arrives
        assert not {4, 5, 6, 7} & set(got.hashes())
        assert feed.stats.missed >= 4
        pub.shutdown()  # type: ignore[attr-defined]
        pub = _publisher(tmp_path)  # the server started again: its sequence from 0
        with _following(feed):
            _connected(pub, got)
            _until(lambda: got.restarts == 1, "the restart said")
        assert feed.stats.restarts == 1
    finally:
        pub.shutdown()  # type: ignore[attr-defined]


def test_garbage_is_counted_and_dropped(tmp_path: Path) -> None:
    import zmq

    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.PUB)
    raw.bind(f"ipc://{tmp_path}/raw")
    got = _Got()
    feed = KvEventFeed(f"ipc://{tmp_path}/raw", got.batches.append, lambda: None)
    try:
        with _following(feed):
            good = b"\x92\xcb\x41\xd9\x00\x00\x00\x00\x00\x00\x90"  # [1.6e9, []]
            seq = 0
            while feed.stats.batches == 0:  # the slow joiner again
                raw.send_multipart([b"", seq.to_bytes(8, "big"), good])
                seq += 1
                time.sleep(0.05)
            for frames in ([b"", b"\x00" * 7, good], [b"only one"],
                           [b"", (seq + 1).to_bytes(8, "big"), b"\xc1"],
                           [b"", (seq + 2).to_bytes(8, "big"), b"\x92\xa1x\x90"]):  # fmt: skip
                raw.send_multipart(frames)
            _until(lambda: feed.stats.refused == 4, "four refused")
        assert feed.stats.batches >= 1 and not got.hashes()
    finally:
        raw.close(linger=0)
