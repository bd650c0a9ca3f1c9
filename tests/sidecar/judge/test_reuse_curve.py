"""The miss-ratio curve against an LRU cache simulated read by read."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import OrderedDict

import pytest

from kvwatch.sidecar.judge.reuse_curve import MODULUS, ReuseCurve, spatial_hash
from kvwatch.sidecar.kvevents.wire import block_key


def _lru_hits(reads: list[int], size: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in reads:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits / len(reads)


def _zipf_reads(n: int, keys: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.9 for i in range(keys)]
    return rng.choices(range(keys), weights, k=n)


def test_exact_without_sampling() -> None:
    reads = _zipf_reads(20_000, 3_000, 1)
    curve = ReuseCurve(max_keys=10_000)
    for k in reads:
        curve.read(block_key(0, k))
    assert curve.rate == 1.0
    for size in (1, 2, 10, 100, 255, 256, 700, 2_000):
        got = curve.hit_ratio(size)
        assert got == pytest.approx(_lru_hits(reads, size), abs=0.004), size
    assert curve.ideal_hit_ratio() == pytest.approx(1 - len(set(reads)) / len(reads))


@pytest.mark.parametrize("seed", [2, 4, 6])
def test_sampled_stays_near_the_truth(seed: int) -> None:
    # the keys move with the seed, so each run samples other hot blocks
    reads = [k + 100_000 * seed for k in _zipf_reads(120_000, 40_000, seed)]
    curve = ReuseCurve(max_keys=2_000)
    for k in reads:
        curve.read(block_key(0, k))
    assert curve.rate < 0.1  # it had to sample
    assert curve.followed <= 2_000
    for size in (2_000, 8_000, 20_000):  # measured: within 2.0 points on five seeds
        assert curve.hit_ratio(size) == pytest.approx(_lru_hits(reads, size), abs=0.025), size


def test_uncounted_reads_move_recency_only() -> None:
    curve = ReuseCurve()
    curve.read(block_key(0, 1), counted=False)  # a decode block: stored, not a query
    curve.read(block_key(0, 2))
    curve.read(block_key(0, 1))  # one other block since: hits from a cache of 2
    assert curve.reads == 2
    assert curve.hit_ratio(1) == 0.0
    assert curve.hit_ratio(2) == 0.5
    assert curve.blocks_for(0.5) == 2
    assert curve.blocks_for(0.9) is None  # above the ideal


def test_old_traffic_goes_by_generations() -> None:
    curve = ReuseCurve(window=100)
    for i in range(250):
        curve.read(block_key(0, i % 10))
    # the answering sample started at read 100 and counted from read 150: its blocks were
    # all read while it warmed up, so none is taken as never read
    assert curve.reads == 100
    assert curve.ideal_hit_ratio() == 1.0
    # the traffic moves to 20 other blocks: two windows on, the curve is theirs alone
    # (a window must be long against the distances asked about: 1M reads in the sidecar)
    for i in range(400):
        curve.read(block_key(0, 1000 + i % 20))
    assert curve.hit_ratio(10) == 0.0 and curve.hit_ratio(20) == 1.0


def test_the_sample_rate_does_not_fall_without_end() -> None:
    """Every block new (decode blocks are): the rate stands on two windows' blocks, not on
    every block ever seen."""
    curve = ReuseCurve(max_keys=100, window=1_000)
    for i in range(20_000):
        curve.read(block_key(0, i))
    assert curve.rate > 100 / 2_000 * 0.5  # one sample over all 20,000: about 100 / 20,000
    assert curve.followed <= 2 * 100


@pytest.mark.parametrize(
    "kind",
    ["sequential", "strided", "high bits", "random ints", "sha256 digests", "second group"],
)
def test_the_spatial_hash_samples_any_block_hashes_evenly(kind: str) -> None:
    rng = random.Random(5)
    n = 100_000
    keys: list[tuple[int, int | bytes]] = {
        "sequential": [(0, i) for i in range(n)],
        "strided": [(0, i * 4096) for i in range(n)],
        "high bits": [(0, i << 40) for i in range(n)],
        "random ints": [(0, rng.getrandbits(64)) for _ in range(n)],
        "sha256 digests": [(0, rng.randbytes(32)) for _ in range(n)],
        "second group": [(1, i) for i in range(n)],
    }[kind]
    hashes = [spatial_hash(block_key(*k)) for k in keys]
    for rate in (0.01, 0.1, 0.5):
        share = sum(h < rate * MODULUS for h in hashes) / n
        assert share == pytest.approx(rate, rel=0.15), (rate, share)  # 0.01: ±5 sd


def test_the_spatial_hash_is_the_same_in_every_process() -> None:
    """A bytes hash is salted per process; the sample must not be (a recording drawn again
    gives the same curve)."""
    keys = [(0, b"\x07" * 32), (2, b"\x01\x02" * 16), (0, 12345), (1, 2**63 + 5)]
    code = (
        "from kvwatch.sidecar.judge.reuse_curve import spatial_hash; "
        "from kvwatch.sidecar.kvevents.wire import block_key; "
        f"print([spatial_hash(block_key(*k)) for k in {keys!r}])"
    )
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True)  # fmt: skip
        assert out.stdout.strip() == str([spatial_hash(block_key(*k)) for k in keys])


def test_a_sample_stays_bounded_when_every_hash_is_the_same() -> None:
    """The threshold falls by a tenth at a time and drops what is at or above it; a publisher
    whose block keys all share their low bits would drop none at a tenth, so it falls again
    until the sample fits (here, to following nothing)."""
    curve = ReuseCurve(max_keys=50)
    for i in range(200):
        curve.read(i << 24)  # spatial hash 0 for every block
    assert curve.followed <= 2 * 50 and curve.rate == 0.0
    curve.read(5 << 24)  # and it goes on reading
    assert curve.reads == 201


def test_lowering_keeps_about_nine_tenths_and_the_clocks_in_order() -> None:
    curve = ReuseCurve(max_keys=1_000)
    rng = random.Random(3)
    keys = [rng.getrandbits(60) for _ in range(5_000)]
    for k in keys + keys[:2_000]:
        curve.read(k)
    s = curve._samples[0]
    assert 800 <= len(s.last) <= 1_000
    assert all(spatial_hash(k) < s.threshold for k in s.last)
    assert s.times == sorted(s.last.values())
