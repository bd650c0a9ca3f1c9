"""A model's replicas' prefix caches seen together: what routing costs them.

A router that spreads a conversation's turns over replicas (round robin, least load) makes each
replica cache its own copy of the same prefixes: the fleet's KV holds duplicates and every
replica misses what another holds. From the replicas' KV events (one sidecar following each
replica's publisher; vLLM's block hashes agree across processes with its default sha256
hashing and a fixed seed, or with one PYTHONHASHSEED), two figures say what that costs:

- **duplicated share**: of the blocks the replicas' prefix caches hold now, the share that is
  a second (or later) copy of a block another replica holds;
- **pooled hit rate**: the hit rate the same reads would get from one cache of the fleet's
  whole memory (an LRU curve over every replica's reads, read at the sum of their blocks).
  A prefix-aware router that sends each request where its prefix lives comes near it.
  Against it, the replicas' own hit rate (their curves at their sizes, weighted by reads).

The gap between the two is the hit rate routing leaves on the table. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.sidecar.judge.block_access import BlockTable
from kvwatch.sidecar.judge.reuse_curve import ReuseCurve

__all__ = ["FleetPrefixView", "Replica", "fleet_prefix_view", "ROUTING_GAP"]

ROUTING_GAP = 0.05  # pooled - replicas' hit rate worth a prefix-aware router (the advice's bar)


@dataclass(frozen=True)
class FleetPrefixView:
    model_name: str
    targets: tuple[str, ...]
    cached_blocks: int  # held by the replicas' prefix caches now, every copy counted
    distinct_blocks: int  # of those, distinct blocks
    duplicated_share: float | None  # (cached - distinct) / cached
    capacity_blocks: int  # the replicas' blocks together
    pooled_hit_ratio: float | None  # one cache of capacity_blocks, the same reads
    replicas_hit_ratio: float | None  # each replica's curve at its own size, read-weighted

    @property
    def routing_gap(self) -> float | None:
        if self.pooled_hit_ratio is None or self.replicas_hit_ratio is None:
            return None
        return self.pooled_hit_ratio - self.replicas_hit_ratio


@dataclass(frozen=True)
class Replica:
    target: str
    table: BlockTable
    curve: ReuseCurve
    capacity_blocks: int


def fleet_prefix_view(
    model_name: str, replicas: Sequence[Replica], pooled: ReuseCurve
) -> FleetPrefixView:
    cached = sum(len(r.table.parent) for r in replicas)
    distinct = len(set().union(*(r.table.parent.keys() for r in replicas))) if replicas else 0
    capacity = sum(r.capacity_blocks for r in replicas)
    weighted = [(h, r.curve.reads) for r in replicas
                if (h := r.curve.hit_ratio(r.capacity_blocks)) is not None]  # fmt: skip
    reads = sum(n for _, n in weighted)
    return FleetPrefixView(
        model_name=model_name,
        targets=tuple(r.target for r in replicas),
        cached_blocks=cached,
        distinct_blocks=distinct,
        duplicated_share=None if not cached else (cached - distinct) / cached,
        capacity_blocks=capacity,
        pooled_hit_ratio=pooled.hit_ratio(capacity) if capacity else None,
        replicas_hit_ratio=None if not reads else sum(h * n for h, n in weighted) / reads,
    )
