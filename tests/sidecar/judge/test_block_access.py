"""vLLM's events turned back into reads: reports, parent chains, continuations, thrash."""

from __future__ import annotations

from kvwatch.sidecar.judge.block_access import BlockTable
from kvwatch.sidecar.kvevents.wire import Cleared, Removed, Stored, block_key

_NAME: dict[int, int] = {}  # a block key: the hash it was made from


def _p(h: int) -> int:
    key = block_key(0, h)
    _NAME[key] = h
    return key


def _k(*hs: int) -> tuple[int, ...]:
    return tuple(_p(h) for h in hs)


def _apply(t: BlockTable, e: object, ts: float) -> list[tuple[int, bool, bool]]:
    """(hash, hit, query) for each block read, as the curve takes them."""
    held = set(t.parent)
    hits, own, counted = t.apply(e, ts)  # type: ignore[arg-type]
    return [(_NAME[k], True, True) for k in hits] + [(_NAME[k], k in held, counted) for k in own]


def test_a_request_that_hits_a_prefix_reads_its_chain() -> None:
    t = BlockTable(continuation_s=5.0)
    assert _apply(t, Stored(_k(1, 2, 3), None), 0.0) == [(1, 0, 1), (2, 0, 1), (3, 0, 1)]
    # the same request's next decode block, 1 s later: a continuation, no query
    assert _apply(t, Stored(_k(4), _p(3)), 1.0) == [(4, False, False)]
    # another request shares blocks 1-2 and computes 9: the chain to its parent is read
    assert _apply(t, Stored(_k(9), _p(2)), 2.0) == [(1, 1, 1), (2, 1, 1), (9, 0, 1)]
    # a turn that continues block 4 after the run went quiet: its whole chain is a hit
    assert _apply(t, Stored(_k(5), _p(4)), 30.0) == [
        (1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 0, 1)
    ]  # fmt: skip


def test_a_report_is_hits_and_its_requests_next_store_reads_no_chain() -> None:
    t = BlockTable()
    _apply(t, Stored(_k(1, 2), None), 0.0)
    # vLLM's report of the reused blocks (parent nil), then the request's first new block
    assert _apply(t, Stored(_k(1, 2), None), 10.0) == [(1, 1, 1), (2, 1, 1)]
    assert _apply(t, Stored(_k(3), _p(2)), 10.0) == [(3, False, True)]
    assert t.counts.reports == 1 and t.source == "reports and parent chains"
    # a request without a report still has its chain read
    assert _apply(t, Stored(_k(4), _p(2)), 40.0) == [(1, 1, 1), (2, 1, 1), (4, 0, 1)]


def test_a_block_stored_again_after_removal_is_thrash() -> None:
    t = BlockTable()
    _apply(t, Stored(_k(1, 2), None), 0.0)
    _apply(t, Removed(_k(2, 77)), 1.0)  # 77 was never held: not counted
    assert t.counts.removed == 1
    _apply(t, Stored(_k(2), _p(1)), 20.0)
    assert t.counts.restored == 1
    _apply(t, Cleared(), 21.0)  # a restart: what was removed before is forgotten
    _apply(t, Stored(_k(1), None), 22.0)
    assert t.counts.restored == 1 and t.counts.clears == 1


def test_the_table_is_bounded() -> None:
    t = BlockTable(max_blocks=100, max_removed=10)
    for i in range(1_000):
        _apply(t, Stored(_k(i), None), float(i))
    # past the bound the oldest eighth goes at once: between 7/8 of it and all of it is kept
    assert 88 <= len(t.parent) <= 100 and t.counts.forgotten == 1_000 - len(t.parent)
    assert min(_NAME[k] for k in t.parent) == 1_000 - len(t.parent)  # the newest are kept
    _apply(t, Removed(_k(*range(900, 1_000))), 1e4)
    assert 9 <= len(t.removed) <= 10 and max(_NAME[k] for k in t.removed) == 999
    _apply(t, Stored(_k(5_000), _p(3)), 1e4)  # a parent long forgotten
    assert t.counts.unknown_parents == 1


def test_the_bound_forgets_the_least_recently_read() -> None:
    t = BlockTable(max_blocks=100)
    for i in range(100):
        _apply(t, Stored(_k(i), None), float(i))
    _apply(t, Stored(_k(500), _p(0)), 200.0)  # a hit on block 0: read last, kept
    for i in range(100, 110):
        _apply(t, Stored(_k(i), None), 300.0 + i)
    assert t.counts.forgotten == 12  # one pass of an eighth
    held = {_NAME[k] for k in t.parent}
    assert 0 in held and 500 in held and not {1, 2, 12} & held and 13 in held
