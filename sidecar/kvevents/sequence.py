"""A publisher's messages put back in order: the next batch fed on, a jump forward counted
as lost (unless the caller recovers it), a jump back read as the publisher starting again,
and a message that is not a batch refused and counted. Pure: the subscriber (live, with
vLLM's replay socket) and a recording's reader (`advise --run`) share it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.sidecar.kvevents.wire import Batch, WireError, decode_batch, decode_seq

__all__ = ["FeedStats", "BatchSequence"]


@dataclass
class FeedStats:
    batches: int = 0  # fed on, in order
    replayed: int = 0  # of those, recovered through the replay endpoint
    missed: int = 0  # batches lost for good (no replay endpoint, or past its buffer)
    refused: int = 0  # messages that were not KV event batches
    unknown_events: int = 0  # events of a type this reader does not know
    other_tier_events: int = 0  # events of a KV offloading tier (CPU, storage), left out
    restarts: int = 0  # the publisher's sequence went back
    last_batch_unix: float | None = None  # our clock when the last batch came


class BatchSequence:
    def __init__(
        self,
        on_batch: Callable[[Batch], None],
        on_restart: Callable[[], None],
        on_raw: Callable[[int, bytes], None] | None = None,
    ) -> None:
        """`on_raw` gets every batch's sequence number and payload as it came (a recording)."""
        self.on_batch = on_batch
        self.on_restart = on_restart
        self.on_raw = on_raw
        self.stats = FeedStats()
        self.next: int | None = None  # the sequence number expected next

    def take(
        self, seq_frame: bytes, payload: bytes, recover: Callable[[int, int], None] | None = None
    ) -> None:
        """One message. Before a jump forward, `recover(first, upto)` may feed the lost ones
        (through `feed`); what it does not is counted as missed."""
        try:
            seq = decode_seq(seq_frame)
        except WireError:
            self.stats.refused += 1
            return
        try:
            batch: Batch | None = decode_batch(payload)
        except WireError:
            batch = None
        if self.next is not None and seq < self.next:
            self.stats.restarts += 1
            self.on_restart()
        elif self.next is not None and seq > self.next:
            first = self.next
            if recover is not None:
                recover(first, seq)
            self.stats.missed += seq - max(first, self.next)
        if batch is None:  # refused, not lost: the sequence goes on past it
            self.stats.refused += 1
            self.next = seq + 1
            return
        self.feed(seq, payload, batch)

    def feed(self, seq: int, payload: bytes, batch: Batch, replayed: bool = False) -> None:
        if self.on_raw is not None:
            self.on_raw(seq, payload)
        self.stats.batches += 1
        self.stats.replayed += replayed
        self.stats.unknown_events += batch.unknown
        self.stats.other_tier_events += batch.other_tier
        self.stats.last_batch_unix = time.time()
        self.on_batch(batch)
        self.next = seq + 1
