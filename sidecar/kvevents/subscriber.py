"""Follow one vLLM server's KV event publisher: subscribe, notice gaps, replay what was missed.

vLLM binds a ZMQ PUB socket (`--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`); this
connects a SUB to it, so a publisher that goes away and comes back (a restart) is reconnected to
by ZMQ itself. Each message carries a sequence number:

- the next one: fed on;
- a jump forward: batches were lost (a slow reader past the high-water mark, a reconnect).
  With a replay endpoint, the missing ones are asked for (vLLM keeps `buffer_steps` of them)
  and fed in order before the new one; what it no longer holds is counted as missed;
- a jump back: the publisher started again with an empty cache: `on_restart` says so.

A message that is not a KV event batch is counted and dropped, never raised. The loop runs in a
thread until `stop`; a failure inside `on_batch` is the caller's (the sidecar runs this loop
supervised). Needs pyzmq and msgspec (both come with vLLM; `pip install kvwatch[kvevents]`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from kvwatch.sidecar.kvevents.recording import MAX_PAYLOAD
from kvwatch.sidecar.kvevents.sequence import BatchSequence
from kvwatch.sidecar.kvevents.wire import Batch, WireError, decode_batch, decode_seq

__all__ = ["KvEventFeed", "check_endpoint"]

_POLL_MS = 200
_REPLAY_WAIT_MS = 2_000
_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_MAX_REPLAYED = 2 * 10_000 + 1  # twice vLLM's default buffer_steps, and its end marker


def check_endpoint(endpoint: str) -> str:
    """A ZMQ endpoint this can connect to: tcp://HOST:PORT or ipc://PATH (one line if not)."""
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[6:].rpartition(":")
        if host in ("", "*") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{endpoint!r}: give tcp://HOST:PORT (the host vLLM binds on)")
        return endpoint
    if endpoint.startswith("ipc://") and len(endpoint) > 6:
        return endpoint
    raise ValueError(f"{endpoint!r} is not a ZMQ endpoint (tcp://HOST:PORT or ipc://PATH)")


class KvEventFeed(BatchSequence):
    def __init__(
        self,
        endpoint: str,
        on_batch: Callable[[Batch], None],
        on_restart: Callable[[], None],
        replay_endpoint: str | None = None,
        topic: str = "",
        on_raw: Callable[[int, bytes], None] | None = None,
    ) -> None:
        super().__init__(on_batch, on_restart, on_raw)
        self.endpoint = check_endpoint(endpoint)
        self.replay_endpoint = None if replay_endpoint is None else check_endpoint(replay_endpoint)
        self.topic = topic.encode()

    def run(self, stop: threading.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Follow the publisher until `stop`; `beat` is called at least every 0.2 s."""
        import zmq

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD)  # a peer that sends more is dropped
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        replay = None
        if self.replay_endpoint is not None:
            replay = ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD)
            replay.connect(self.replay_endpoint)
        recover = None if replay is None else functools.partial(self._recover, replay)
        # a blocking receive that gives up after _POLL_MS, not poll() then recv(): poll builds a
        # Poller in Python for every message, and at 15 batches/s under 256 running requests
        # that was a third of this thread's samples (py-spy, 2026-12-06)
        sub.setsockopt(zmq.RCVTIMEO, _POLL_MS)
        try:
            while not stop.is_set():
                try:
                    frames = sub.recv_multipart()
                except zmq.Again:  # nothing for _POLL_MS
                    beat()
                    continue
                if len(frames) == 3:
                    self.take(frames[1], frames[2], recover)
                else:
                    self.stats.refused += 1
                beat()
        finally:
            sub.close()
            if replay is not None:
                replay.close()

    def _recover(self, replay: Any, first: int, upto: int) -> None:
        """Batches `first` .. `upto - 1` were lost: ask the replay endpoint for them and feed
        the ones it still holds, in order (the caller counts the rest as missed)."""
        replay.send_multipart([b"", first.to_bytes(8, "big")])
        for _ in range(_MAX_REPLAYED):  # vLLM sends its buffer from `first` on, then the end
            if not replay.poll(_REPLAY_WAIT_MS):
                break
            frames = replay.recv_multipart()
            # [b"", topic, seq, payload]; the end is [b"", b"", END_SEQ, b""]
            if len(frames) != 4 or frames[2] == _END_SEQ:
                break
            try:
                seq = decode_seq(frames[2])
                batch = decode_batch(frames[3])
            except WireError:
                self.stats.refused += 1
                continue
            if (self.next or 0) <= seq < upto:  # in order, once; the rest comes on the SUB
                self.stats.missed += seq - (self.next or 0)
                self.feed(seq, frames[3], batch, replayed=True)
