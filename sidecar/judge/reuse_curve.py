"""The prefix cache's miss-ratio curve: the hit rate the same traffic gets at every cache size.

An LRU cache of C blocks hits a read when fewer than C other blocks were read since the block's
last read (its reuse, or stack, distance). So one pass over the reads gives the hit rate at
every size at once (Mattson et al., 1970): the share of reads whose distance is below C. A read
of a block never seen before misses at any size: what is left is the ideal (infinite cache)
hit rate.

Memory is bounded by spatial sampling (SHARDS, Waldspurger et al., FAST 2015): a block is
followed only when a hash of its key falls below a threshold T of a modulus P, so a rate of
R = T/P of the blocks, and a distance measured among the followed blocks stands for d/R
blocks. Fixed size: when more than `max_keys` are followed, T is lowered to drop the tenth with
the highest hashes, and each read from then on counts 1/R of the reads; the gap between the
reads counted that way and all the reads (which are all seen) is added as hits at distance 0
(SHARDS-adj: the gap comes from whether the hottest blocks were sampled). Its error grows as R
falls, which `rate` reports. Distances are kept in bins one block wide up to 256 and 1% wide
above, read by interpolation inside a bin. Old traffic fades: when the counted reads pass
`window`, every count is halved.

vLLM's eviction is not exactly LRU (it frees a finished request's blocks tail first, and a
running request's blocks cannot be evicted at all); docs/detection.md says how far the curve
and the server's own rate differ on traces. Pure.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from kvwatch.sidecar.kvevents.wire import BlockKey

__all__ = ["ReuseCurve", "CurvePoint", "MAX_KEYS"]

MODULUS = 1 << 24
MAX_KEYS = 16_384  # blocks followed at most by default: about 3 MB of the sidecar's memory
_BIN = math.log(1.01)


_M64 = (1 << 64) - 1


def _spatial_hash(key: BlockKey) -> int:
    """A well-mixed 24-bit hash of a block key (splitmix64's finaliser): vLLM's block hashes
    are digests already, but one taken modulo a power of two must not lean on that."""
    group, h = key
    x = int.from_bytes(h[:8], "big") if isinstance(h, bytes) else h & _M64
    x = (x ^ (group * 0x9E3779B97F4A7C15)) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) >> 40


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


class ReuseCurve:
    """Reads in, the hit rate at any cache size out."""

    def __init__(self, max_keys: int = MAX_KEYS, window: float = 2_000_000.0) -> None:
        self.max_keys = max_keys
        self.window = window
        self.threshold = MODULUS  # rate 1 until more than max_keys blocks are followed
        self._last: dict[BlockKey, int] = {}  # followed block: the clock of its last read
        self._hash: dict[BlockKey, int] = {}
        self._times: list[int] = []  # the followed blocks' last-read clocks, ascending
        self._clock = 0
        self._bins: dict[int, float] = {}  # distance bin: reads (each 1/R)
        self.cold = 0.0  # reads of blocks never read before (each 1/R)
        self.sampled = 0.0  # counted reads of followed blocks (each 1/R)
        self.reads = 0.0  # every counted read (queries), followed or not

    @property
    def rate(self) -> float:
        return self.threshold / MODULUS

    def read(self, key: BlockKey, counted: bool = True) -> None:
        """A read of `key`; `counted` ones enter the hit rate, the rest only move recency."""
        if counted:
            self.reads += 1
            if self.reads > self.window:
                self._fade()
        h = self._hash.get(key)
        if h is None:
            h = _spatial_hash(key)
            if h >= self.threshold:
                return
        weight = 1.0 / self.rate
        self._clock += 1
        prev = self._last.get(key)
        if prev is None:
            self._hash[key] = h
            if counted:
                self.cold += weight
        else:
            i = bisect_left(self._times, prev)
            distance = (len(self._times) - bisect_right(self._times, prev)) / self.rate
            del self._times[i]
            if counted:
                b = _bin(distance)
                self._bins[b] = self._bins.get(b, 0.0) + weight
        self._last[key] = self._clock
        self._times.append(self._clock)
        if counted:
            self.sampled += weight
        if len(self._last) > self.max_keys:
            self._lower_threshold()

    def hit_ratio(self, blocks: float) -> float | None:
        """The share of counted reads an LRU cache of `blocks` would have hit; None before any."""
        if self.reads <= 0:
            return None
        hits = self._adjustment()
        for b, n in self._bins.items():
            lo, hi = _bin_edges(b)
            if hi <= blocks:
                hits += n
            elif lo < blocks:  # distance < blocks: a part of the bin, spread evenly
                hits += n * (blocks - lo) / (hi - lo)
        return min(1.0, max(0.0, hits / self.reads))

    def ideal_hit_ratio(self) -> float | None:
        """The hit rate with room for everything: all but the first reads of each block."""
        if self.reads <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.cold / self.reads))

    def blocks_for(self, hit_ratio: float) -> int | None:
        """The smallest cache (blocks) whose hit rate reaches `hit_ratio`; None if none does."""
        ideal = self.ideal_hit_ratio()
        if ideal is None or hit_ratio > ideal + 1e-12:
            return None
        need = hit_ratio * self.reads
        got = self._adjustment()
        if got >= need:
            return 1
        for b in sorted(self._bins):
            n = self._bins[b]
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

    @property
    def followed(self) -> int:
        return len(self._last)

    def _fade(self) -> None:
        self._bins = {b: n / 2 for b, n in self._bins.items() if n > 1e-9}
        self.cold /= 2
        self.sampled /= 2
        self.reads /= 2

    def _adjustment(self) -> float:
        """SHARDS-adj: the reads the sample missed or over-counted, as hits at distance 0.
        Its error is mostly in the hottest blocks (whether a block that carries a tenth of the
        reads was sampled), and those are read again at once."""
        return self.reads - self.sampled

    def _lower_threshold(self) -> None:
        """Drop the tenth of the followed blocks with the highest hashes (fixed-size SHARDS)."""
        by_hash = sorted(self._hash.values())
        keep = max(1, int(self.max_keys * 0.9))
        self.threshold = by_hash[keep - 1] + 1 if keep < len(by_hash) else self.threshold
        gone = [k for k, h in self._hash.items() if h >= self.threshold]
        for k in gone:
            del self._hash[k]
            del self._last[k]
        self._times = sorted(self._last.values())
