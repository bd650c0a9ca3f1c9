"""vLLM's KV events turned back into the block accesses the prefix cache saw.

The event stream says what the cache stored and removed, not what each request read. The reads
are reconstructed two ways:

- **Reports** (exact): a request sent with `vllm_xargs: {"kv_cache_report_mode": "full"}`
  makes vLLM publish the cached blocks it reused as a `BlockStored` of blocks already held,
  with no parent (vllm/v1/core/kv_cache_manager.py, `emit_cached_block_events`). Such a store
  is read as a report: every block in it is a hit, and the same request's first new block,
  stored under the report's last block, reads no chain again.
- **The parent chain** (inferred, for traffic nobody tagged): a request that hit a cached
  prefix stores its first new block with `parent_block_hash` the last block it hit, so the
  cached chain up to that parent was read. A store whose parent is the newest block of a run
  stored less than `continuation_s` ago continues that run instead (the same request's next
  prompt chunk or its next decode block): its chain is not read again. The price: a request
  that continues a conversation within `continuation_s` of its previous turn's last block
  reads as a continuation, so its hits are missed (the curve errs low); a request whose prompt
  was entirely cached and whose output fills no block stores nothing and is not seen.

An event's reads come as one `Reads`: the cached chain it hit (queries all), then its own
blocks, which are queries when they are part of a request's admission (blocks a newly arriving
request computed), as vLLM's prefix-cache hit rate counts them; continuations (later chunks,
decode blocks) are reads too but no queries. One value per event, not one per block: the
sidecar pays for every block vLLM stores (issue #45's CPU target). A block stored
again after the server removed it is a re-store: prefix-cache thrash, counted exactly while
the removed blocks fit `max_removed`. Bounded memory: at most `max_blocks` cached blocks and
`max_removed` removed ones are remembered; past a bound the oldest eighth is forgotten at once
(counted). At once, because a dict has no cheap oldest entry once many were deleted from its
front: `next(iter(d))` walks every deleted slot, so dropping one entry per store cost 10 to 117
us a block at the 131,072 removed blocks, growing with the sidecar's uptime (measured
2026-12-06); an eighth in one pass costs that walk once per eighth. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple, TypeVar

from kvwatch.sidecar.kvevents.wire import BlockKey, Cleared, Event, Removed, Stored

__all__ = ["Reads", "BlockTable", "TableCounts"]

MAX_CHAIN = 65_536  # blocks walked up one parent chain (a 1M-token context at block size 16)
# About 100 bytes a cached block and 110 a removed one with 64-bit keys and a dict's slot
# (measured 2026-12-06; 190 and 200 while keys were (group, digest) tuples), some 16 fewer since
# keys are 60-bit ints of 32 bytes (wire.block_key): 524,288 cached blocks (8M tokens at 16 a
# block) cost at most about 52 MB, the removed ones 14 MB; a server with more blocks has its
# least recently used ones forgotten here (counted: `forgotten`)
MAX_BLOCKS = 1 << 19
MAX_REMOVED = 1 << 17
_MAX_REPORTED = 4096  # reports whose request has not stored its first new block yet
K = TypeVar("K")
V = TypeVar("V")
_DROP_SHARE = 8  # past a bound, the oldest 1/8 of the entries go in one pass


def _drop_oldest(entries: dict[K, V], bound: int) -> list[K]:
    """The oldest `bound / _DROP_SHARE` keys of `entries` (insertion order) removed in one
    pass; they are returned."""
    old = list(islice(entries, max(1, bound // _DROP_SHARE)))
    for key in old:
        del entries[key]
    return old


class Reads(NamedTuple):
    """One event's block reads, in order: `hits` (cached blocks its request read: queries),
    then `own` (the event's blocks: queries when `counted`)."""

    hits: Sequence[BlockKey]
    own: Sequence[BlockKey]
    counted: bool


_NONE = Reads((), (), False)
_GONE = object()


@dataclass
class TableCounts:
    stores: int = 0  # BlockStored events that stored new blocks
    reports: int = 0  # BlockStored events that reported reused blocks
    removed: int = 0  # blocks removed
    restored: int = 0  # blocks stored again after the server removed them (thrash)
    clears: int = 0  # AllBlocksCleared (a restart, a reset)
    forgotten: int = 0  # cached blocks dropped from the table at its bound
    unknown_parents: int = 0  # stores whose parent the table never saw (a gap, a cap)


class BlockTable:
    """The prefix cache as the events describe it; `apply` gives each event's accesses."""

    def __init__(
        self,
        continuation_s: float = 5.0,
        max_blocks: int = MAX_BLOCKS,
        max_removed: int = MAX_REMOVED,
    ) -> None:
        self.continuation_s = continuation_s
        self.max_blocks = max_blocks
        self.max_removed = max_removed
        self.parent: dict[BlockKey, BlockKey | None] = {}  # cached now, oldest first
        self.tips: dict[BlockKey, float] = {}  # a run's newest block: when it was stored
        self.removed: dict[BlockKey, None] = {}  # removed, not stored again; oldest first
        self.reported: dict[BlockKey, float] = {}  # a report's last block: when it came
        self.counts = TableCounts()

    @property
    def source(self) -> str:
        """How the hits were known: vLLM's reports, the parent chains, or both."""
        return "parent chains" if not self.counts.reports else "reports and parent chains"

    def apply(self, event: Event, ts: float) -> Reads:
        """The reads `event` stands for (none for a removal or a reset)."""
        if type(event) is Stored:
            return self._stored(event, ts) if event.keys else _NONE
        if type(event) is Removed:
            table, tips, removed = self.parent, self.tips, self.removed
            for key in event.keys:
                if table.pop(key, 0) != 0:
                    self.counts.removed += 1
                    tips.pop(key, None)
                    removed[key] = None
                    if len(removed) > self.max_removed:
                        _drop_oldest(removed, self.max_removed)
        elif isinstance(event, Cleared):
            self.parent.clear()
            self.tips.clear()
            self.reported.clear()
            self.removed.clear()  # after a restart, a store again is not an eviction's cost
            self.counts.clears += 1
        return _NONE

    def _stored(self, event: Stored, ts: float) -> Reads:
        table, keys, parent = self.parent, event.keys, event.parent
        if parent is None and all(k in table for k in keys):
            self.counts.reports += 1
            for key in keys:
                table[key] = table.pop(key)  # keep the order by last use for the bound
            self.reported[keys[-1]] = ts
            if len(self.reported) > _MAX_REPORTED:
                _drop_oldest(self.reported, _MAX_REPORTED)
            return Reads(keys, (), True)
        self.counts.stores += 1
        hits: Sequence[BlockKey] = ()
        continues = after_report = False
        if parent is not None:
            stored_at = self.tips.pop(parent, None)
            continues = stored_at is not None and ts - stored_at <= self.continuation_s
            if self.reported:
                reported_at = self.reported.pop(parent, None)
                after_report = reported_at is not None and ts - reported_at <= self.continuation_s
            if parent not in table:
                self.counts.unknown_parents += 1
            elif not continues and not after_report:
                hits = self._chain(parent)
                for key in hits:
                    table[key] = table.pop(key)
        removed, before = self.removed, parent
        for key in keys:
            if key in table:
                table[key] = table.pop(key)
            else:
                if removed and removed.pop(key, 0) is None:
                    self.counts.restored += 1
                table[key] = before
                if len(table) > self.max_blocks:  # the least recently used go
                    for old in _drop_oldest(table, self.max_blocks):
                        self.tips.pop(old, None)
                        self.counts.forgotten += 1
            before = key
        self.tips[keys[-1]] = ts
        return Reads(hits, keys, not continues or after_report)

    def _chain(self, last: BlockKey) -> list[BlockKey]:
        """The cached blocks from the root of `last`'s chain down to `last`, in read order."""
        table = self.parent
        out: list[BlockKey] = []
        key: BlockKey | None = last
        while key is not None and len(out) < MAX_CHAIN:
            up = table.get(key, _GONE)
            if up is _GONE:
                break
            out.append(key)
            key = up  # type: ignore[assignment]
        out.reverse()
        return out
