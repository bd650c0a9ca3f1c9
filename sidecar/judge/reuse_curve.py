"""The prefix cache's miss-ratio curve: the hit rate the same traffic gets at every cache size.

An LRU cache of C blocks hits a read when fewer than C other blocks were read since the block's
last read (its reuse, or stack, distance). So one pass over the reads gives the hit rate at
every size at once (Mattson et al., 1970): the share of reads whose distance is below C. A read
of a block never seen before misses at any size: what is left is the ideal (infinite cache)
hit rate.

Memory is bounded by spatial sampling (SHARDS, Waldspurger et al., FAST 2015): a block is
followed only when a hash of its key falls below a threshold T of a modulus P, so a rate of
R = T/P of the blocks, and a distance measured among the followed blocks stands for d/R
blocks. Fixed size: when more than `max_keys` are followed, T is lowered by a tenth (the
followed blocks at or above it, about a tenth, are dropped), and each read from then on counts
1/R of the reads; the gap between the reads counted that way and all the reads (which are all
seen) is added as hits at distance 0 (SHARDS-adj: the gap comes from whether the hottest blocks
were sampled). Its error grows as R falls, which `rate` reports. Distances are kept in bins one
block wide up to 256 and 1% wide above, read by interpolation inside a bin.

Old traffic goes by generations. A sample that ran for days would hold the lowest hashes of
every block ever stored (every decode block is new), so its rate, and the share of today's
working set it follows, would fall without end. Instead a new sample starts every `window`
counted reads, counts from half a window on (so the blocks read just before it started are not
taken as never read), and answers from a window on, when the one before it is dropped: the
figures stand on the last half to one and a half windows of reads, at a rate of `max_keys` over
the blocks seen in at most two windows. Two samples run at once: twice the per-block work of
one, the price of a rate that does not fall.

vLLM's eviction is not exactly LRU (it frees a finished request's blocks tail first, and a
running request's blocks cannot be evicted at all); docs/detection.md says how far the curve
and the server's own rate differ on traces. Pure.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.sidecar.kvevents.wire import BlockKey

__all__ = ["ReuseCurve", "CurvePoint", "MAX_KEYS", "MODULUS", "WINDOW", "spatial_hash"]

MODULUS = 1 << 24
MAX_KEYS = 8_192  # blocks one sample follows at most: about 1.5 MB of the sidecar's memory
WINDOW = 1_000_000.0  # counted reads between two samples' starts (see ReuseCurve._advance)
_BIN = math.log(1.01)
_MASK = MODULUS - 1


def spatial_hash(key: BlockKey) -> int:
    """A 24-bit hash of a block key, the same in every process: the key's low bits (the key is
    Python's tuple hash of the group and the block's hash, xxHash's multiply-rotate rounds,
    which Python never salts: wire.block_key). Tested uniform on sequential, strided and
    random hashes (tests/sidecar/judge/test_reuse_curve.py)."""
    return key & _MASK


_UNIT = 256  # below this distance bins are one block wide, above they are 1% wide


def _bin(distance: float) -> int:
    if distance < _UNIT:
        return int(distance)
    return _UNIT + int(math.log(distance / _UNIT) / _BIN)


def _bin_edges(b: int) -> tuple[float, float]:
    if b < _UNIT:
        return float(b), float(b + 1)
    return _UNIT * math.exp((b - _UNIT) * _BIN), _UNIT * math.exp((b + 1 - _UNIT) * _BIN)


@dataclass(frozen=True)
class CurvePoint:
    blocks: int
    hit_ratio: float
    factor: float | None = None  # the size as a multiple of the server's, where one is known


class _Sample:
    """One generation: the followed blocks, their reuse distances (fixed-size SHARDS), and
    whether it counts reads yet (a new one first only learns what was read lately)."""

    def __init__(self, max_keys: int, counting: bool) -> None:
        self.max_keys = max_keys
        self.counting = counting
        self.threshold = MODULUS  # rate 1 until more than max_keys blocks are followed
        self.last: dict[BlockKey, int] = {}  # followed block: the clock of its last read
        self.times: list[int] = []  # the followed blocks' last-read clocks, ascending
        self.clock = 0
        self.bins: dict[int, float] = {}  # distance bin: reads (each 1/R)
        self.cold = 0.0  # reads of blocks never read before (each 1/R)
        self.sampled = 0.0  # counted reads of followed blocks (each 1/R)
        self.reads = 0.0  # every counted read (queries), followed or not
        self.age = 0.0  # counted reads since it started, counting or not

    @property
    def rate(self) -> float:
        return self.threshold / MODULUS

    def follow(self, key: BlockKey, counted: bool) -> None:
        """A read of a followed block (its spatial hash is under the threshold)."""
        counted = counted and self.counting
        weight = MODULUS / self.threshold
        self.clock += 1
        prev = self.last.get(key)
        if prev is None:
            if counted:
                self.cold += weight
        else:
            times = self.times
            i = bisect_left(times, prev)
            distance = (len(times) - i - 1) * weight
            del times[i]
            if counted:
                b = _bin(distance)
                self.bins[b] = self.bins.get(b, 0.0) + weight
        self.last[key] = self.clock
        self.times.append(self.clock)
        if counted:
            self.sampled += weight
        if len(self.last) > self.max_keys:
            self._lower_threshold()

    def hits_at(self, blocks: float) -> float:
        hits = self.adjustment()
        for b, n in self.bins.items():
            lo, hi = _bin_edges(b)
            if hi <= blocks:
                hits += n
            elif lo < blocks:  # distance < blocks: a part of the bin, spread evenly
                hits += n * (blocks - lo) / (hi - lo)
        return hits

    def adjustment(self) -> float:
        """SHARDS-adj: the reads the sample missed or over-counted, as hits at distance 0.
        Its error is mostly in the hottest blocks (whether a block that carries a tenth of the
        reads was sampled), and those are read again at once."""
        return self.reads - self.sampled

    def _lower_threshold(self) -> None:
        """Lower the threshold by a tenth and drop the followed blocks at or above it: about a
        tenth of them, as the followed hashes are uniform below the threshold (a tenth exactly
        needed a sort of every hash: a third of the event thread's time under 256 running
        requests, py-spy 2026-12-07; this is one pass over the blocks and one over their
        clocks). Again until the sample fits, so hashes bunched on purpose cannot hold it
        over its size: at a threshold of 0 nothing is followed."""
        last = self.last
        gone: set[int] = set()  # the dropped blocks' clocks
        while len(last) > self.max_keys and self.threshold > 0:
            threshold = self.threshold = self.threshold * 9 // 10
            gone.update(last.pop(k) for k in [k for k in last if k & _MASK >= threshold])
        self.times = [t for t in self.times if t not in gone]  # still ascending


class ReuseCurve:
    """Reads in, the hit rate at any cache size out, over the last one to two windows."""

    def __init__(self, max_keys: int = MAX_KEYS, window: float = WINDOW) -> None:
        self.max_keys = max_keys
        self.window = window
        self._samples = [_Sample(max_keys, counting=True)]  # the answering one first

    @property
    def rate(self) -> float:
        """The share of blocks the answering sample follows."""
        return self._samples[0].rate

    @property
    def reads(self) -> float:
        """The counted reads the figures stand on."""
        return self._samples[0].reads

    @property
    def followed(self) -> int:
        return sum(len(s.last) for s in self._samples)

    def read(self, key: BlockKey, counted: bool = True) -> None:
        """A read of `key`; `counted` ones enter the hit rate, the rest only move recency."""
        self.read_many((key,), counted)

    def read_many(self, keys: Sequence[BlockKey], counted: bool = True) -> None:
        """Reads of `keys` in order, all counted or none: the per-block path the sidecar runs
        for every block vLLM stores, so a block outside the samples costs one hash."""
        if not keys:
            return
        if counted:
            self._advance(len(keys))
        samples = self._samples
        for key in keys:
            h = key & _MASK  # spatial_hash, inline: it runs for every block vLLM stores
            for sample in samples:
                if h < sample.threshold:
                    sample.follow(key, counted)

    def _advance(self, n: int) -> None:
        """Every `window` counted reads a new sample starts; it counts from half a window on
        (by then it knows the blocks read lately, so a block read before it started is not
        taken as never read) and answers from a window on, when the one before it goes."""
        samples = self._samples
        young = samples[-1]
        if young.age >= self.window:
            if len(samples) == 2:
                del samples[0]
            samples.append(_Sample(self.max_keys, counting=False))
        for s in samples:
            s.age += n
            if not s.counting and s.age > self.window / 2:
                s.counting = True
            if s.counting:
                s.reads += n

    def hit_ratio(self, blocks: float) -> float | None:
        """The share of counted reads an LRU cache of `blocks` would have hit; None before any."""
        s = self._samples[0]
        if s.reads <= 0:
            return None
        return min(1.0, max(0.0, s.hits_at(blocks) / s.reads))

    def ideal_hit_ratio(self) -> float | None:
        """The hit rate with room for everything: all but the first reads of each block."""
        s = self._samples[0]
        if s.reads <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - s.cold / s.reads))

    def blocks_for(self, hit_ratio: float) -> int | None:
        """The smallest cache (blocks) whose hit rate reaches `hit_ratio`; None if none does."""
        ideal = self.ideal_hit_ratio()
        if ideal is None or hit_ratio > ideal + 1e-12:
            return None
        s = self._samples[0]
        need = hit_ratio * s.reads
        got = s.adjustment()
        if got >= need:
            return 1
        for b in sorted(s.bins):
            n = s.bins[b]
            if got + n >= need:
                lo, hi = _bin_edges(b)
                return max(1, math.ceil(lo + (hi - lo) * (need - got) / n))
            got += n
        return None

    def points(self, sizes: list[int]) -> list[CurvePoint]:
        out = []
        for s in sizes:
            r = self.hit_ratio(s)
            if r is not None:
                out.append(CurvePoint(s, r))
        return out
