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

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.sidecar.kvevents.wire import Batch, WireError, decode_batch, decode_seq

__all__ = ["FeedStats", "KvEventFeed", "check_endpoint"]

_POLL_MS = 200
_REPLAY_WAIT_MS = 2_000
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


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


@dataclass
class FeedStats:
    batches: int = 0  # fed on, in order
    replayed: int = 0  # of those, recovered through the replay endpoint
    missed: int = 0  # batches lost for good (no replay endpoint, or past its buffer)
    refused: int = 0  # messages that were not KV event batches
    unknown_events: int = 0  # events of a type this reader does not know
    restarts: int = 0  # the publisher's sequence went back
    last_batch_unix: float | None = None  # our clock when the last batch came


class KvEventFeed:
    def __init__(
        self,
        endpoint: str,
        on_batch: Callable[[Batch], None],
        on_restart: Callable[[], None],
        replay_endpoint: str | None = None,
        topic: str = "",
    ) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.replay_endpoint = None if replay_endpoint is None else check_endpoint(replay_endpoint)
        self.topic = topic.encode()
        self.on_batch = on_batch
        self.on_restart = on_restart
        self.stats = FeedStats()
        self._next: int | None = None

    def run(self, stop: threading.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Follow the publisher until `stop`; `beat` is called at least every 0.2 s."""
        import zmq

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        replay = None
        if self.replay_endpoint is not None:
            replay = ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.connect(self.replay_endpoint)
        try:
            while not stop.is_set():
                if sub.poll(_POLL_MS):
                    self._message(sub.recv_multipart(), replay)
                beat()
        finally:
            sub.close()
            if replay is not None:
                replay.close()

    def _message(self, frames: list[bytes], replay: object) -> None:
        if len(frames) != 3:
            self.stats.refused += 1
            return
        try:
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
        except WireError:
            self.stats.refused += 1
            return
        if self._next is not None and seq < self._next:
            self.stats.restarts += 1
            self.on_restart()
        elif self._next is not None and seq > self._next:
            self._recover(self._next, seq, replay)
        self._feed(batch)
        self._next = seq + 1

    def _feed(self, batch: Batch) -> None:
        self.stats.batches += 1
        self.stats.unknown_events += batch.unknown
        self.stats.last_batch_unix = time.time()
        self.on_batch(batch)

    def _recover(self, first: int, upto: int, replay: object) -> None:
        """Batches `first` .. `upto - 1` were lost: ask the replay endpoint for them."""
        import zmq

        got = first
        if isinstance(replay, zmq.Socket):
            replay.send_multipart([b"", first.to_bytes(8, "big")])
            while replay.poll(_REPLAY_WAIT_MS):
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
                if got <= seq < upto:  # in order, once; the rest arrives on the SUB
                    self.stats.missed += seq - got
                    self.stats.replayed += 1
                    self._feed(batch)
                    got = seq + 1
        self.stats.missed += upto - got
