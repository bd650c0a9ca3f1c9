"""One engine's KV event stream judged: its block reads, its miss-ratio curve, its thrash.

Joins the block table (block_access.py: events to reads) and the curve (reuse_curve.py: reads
to the hit rate at every size) and reads them at the sizes an operator asks about: 0.25x to 4x
the blocks the server has. Pure: the subscriber's thread feeds it under the state's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvwatch.sidecar.judge.block_access import BlockTable, TableCounts
from kvwatch.sidecar.judge.reuse_curve import MAX_KEYS, CurvePoint, ReuseCurve
from kvwatch.sidecar.kvevents.sequence import BatchSequence, FeedStats
from kvwatch.sidecar.kvevents.wire import Batch, Cleared
from kvwatch.sizing.advice import PrefixCurveSeen

__all__ = ["CURVE_FACTORS", "PrefixCurve", "PrefixCurveView"]

# the sizes the curve is read at, as multiples of the server's own blocks
CURVE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
IDEAL_SHARE = 0.99  # the working set: the size that reaches this share of the ideal hit rate


@dataclass(frozen=True)
class PrefixCurveView:
    capacity_blocks: int | None  # the server's, where known; the curve's sizes scale from it
    points: tuple[CurvePoint, ...]  # the hit rate at CURVE_FACTORS x the capacity
    hit_ratio_now: float | None  # the curve at the server's own size
    ideal_hit_ratio: float | None  # with room for everything
    working_set_blocks: int | None  # the size that reaches IDEAL_SHARE of the ideal
    queries: float  # block reads counted in the hit rate (after fading)
    restored_blocks: int  # stored again after the server removed them (exact)
    sample_rate: float  # the share of blocks the curve follows
    source: str  # "parent chains" (inferred), or "reports and parent chains" (vLLM said some)
    counts: TableCounts


class PrefixCurve:
    def __init__(self, max_keys: int = MAX_KEYS, continuation_s: float = 5.0) -> None:
        self.table = BlockTable(continuation_s=continuation_s)
        self.curve = ReuseCurve(max_keys=max_keys)

    def feed(self, batch: Batch, pooled: ReuseCurve | None = None) -> None:
        """One batch's reads into the curve, and into `pooled` (the fleet's: one curve over
        every replica's reads) where given."""
        table, curve, ts = self.table, self.curve, batch.ts
        for event in batch.events:
            # a reset (Cleared) empties the table; the traffic's history in the curve stays
            hits, own, counted = table.apply(event, ts)
            for c in (curve, pooled):
                if c is not None:
                    c.read_many(hits, True)
                    c.read_many(own, counted)

    def replay(self, frames: Iterable[tuple[int, bytes]]) -> FeedStats:
        """A recording's (sequence, payload) frames put in order and fed, as the live feed
        would have: what was lost, refused or restarted is counted in what it returns."""
        seq = BatchSequence(self.feed, self.restart)
        for n, payload in frames:
            seq.take(n.to_bytes(8, "big"), payload)
        return seq.stats

    def restart(self) -> None:
        """The publisher started again (its sequence went back): its cache is a new one."""
        self.table.apply(Cleared(), 0.0)

    def view(self, capacity_blocks: int | None) -> PrefixCurveView:
        c = self.curve
        points: tuple[CurvePoint, ...] = ()
        now = None
        if capacity_blocks:
            sizes = [(f, max(1, round(f * capacity_blocks))) for f in CURVE_FACTORS]
            points = tuple(
                CurvePoint(b, r, f) for f, b in sizes if (r := c.hit_ratio(b)) is not None
            )
            now = c.hit_ratio(capacity_blocks)
        ideal = c.ideal_hit_ratio()
        return PrefixCurveView(
            capacity_blocks=capacity_blocks,
            points=points,
            hit_ratio_now=now,
            ideal_hit_ratio=ideal,
            working_set_blocks=None if not ideal else c.blocks_for(IDEAL_SHARE * ideal),
            queries=c.reads,
            restored_blocks=self.table.counts.restored,
            sample_rate=c.rate,
            source=self.table.source,
            counts=self.table.counts,
        )

    def seen(self, capacity_blocks: int) -> PrefixCurveSeen | None:
        """What the advice takes of the curve at a server of `capacity_blocks`; None before
        any read was counted."""
        v = self.view(capacity_blocks)
        if v.ideal_hit_ratio is None or not v.points:
            return None
        return PrefixCurveSeen(
            points=tuple((p.blocks, p.hit_ratio) for p in v.points),
            ideal=v.ideal_hit_ratio,
            working_set_blocks=v.working_set_blocks,
            source=v.source,
        )
