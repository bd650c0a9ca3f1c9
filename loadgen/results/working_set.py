"""The KV cache a session workload needs to keep every live conversation cached: its working set.

A conversation's context must stay in the prefix cache from the turn that computed it until
its next turn reuses it, think time included. From the records the load generator kept: each
session holds, from a turn's send until the next turn's send, the blocks of that turn's prompt
and answer (the KV of all but the answer's last token); a system prompt all sessions share is
held once. The peak of their sum over the run is the working set. A cache with that many blocks
free for it serves every turn's context from the cache; one without evicts the oldest contexts,
and their next turns compute them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "WorkingSet", "session_working_set", "working_set_advice", "render_working_set", "HEADROOM",
]  # fmt: skip

HEADROOM = 0.10


@dataclass(frozen=True)
class WorkingSet:
    peak_blocks: int  # blocks the live conversations held at once, at most
    peak_tokens: int
    sessions_at_peak: int
    at_s: float  # when (the run's seconds)
    block_size: int

    @property
    def advised_blocks(self) -> int:
        """Blocks to keep every conversation cached: the peak, a tenth more (the running
        batch grows between the records' turn boundaries, and LRU evicts at the edge), and
        vLLM's null block."""
        return math.ceil(self.peak_blocks * (1 + HEADROOM)) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_blocks": self.peak_blocks, "peak_tokens": self.peak_tokens,
            "sessions_at_peak": self.sessions_at_peak, "at_s": self.at_s,
            "block_size": self.block_size, "advised_blocks": self.advised_blocks,
        }  # fmt: skip


def session_working_set(
    records: list[dict[str, Any]], block_size: int, shared_tokens: int = 0
) -> WorkingSet | None:
    """None without completed session turns."""
    turns: dict[str, list[tuple[float, float, int, Any]]] = {}
    for r in records:
        if r.get("session") is None or not r.get("ok") or r.get("sent_at") is None:
            continue
        kv = (r.get("prompt_tokens") or 0) + max(0, (r.get("output_tokens") or 0) - 1)
        # a turn's calls (fanned out) share its number; they leave microseconds apart, so
        # their send times do not group them (records without a turn fall back to those)
        turn = r.get("turn") if isinstance(r.get("turn"), int) else r["sent_at"]
        turns.setdefault(r["session"], []).append((r["sent_at"], r["finished_at"], kv, turn))
    if not turns or block_size < 1:
        return None
    shared = shared_tokens // block_size  # whole blocks of the shared system prompt
    events: list[tuple[float, int, int, int]] = []  # (time, +/- blocks, +/- tokens, +/- session)
    for calls in turns.values():
        calls.sort(key=lambda c: c[0])
        by_turn: dict[Any, list[int]] = {}  # in the order the turns were first sent
        first_sent: dict[Any, float] = {}
        for sent, _, kv, turn in calls:
            by_turn.setdefault(turn, []).append(kv)
            first_sent.setdefault(turn, sent)
        end = max(c[1] for c in calls)
        held_blocks = held_tokens = 0
        for i, (turn, kvs) in enumerate(by_turn.items()):
            # fanned out, each call is the context so far plus its own part, and the cache
            # holds the context once: the calls' sum less the context counted n - 1 times too
            sent = first_sent[turn]
            tokens = sum(kvs) - (len(kvs) - 1) * held_tokens
            blocks = math.ceil(tokens / block_size) - shared
            events.append((sent, blocks - held_blocks, tokens - held_tokens, 1 if i == 0 else 0))
            held_blocks, held_tokens = blocks, tokens
        events.append((end, -held_blocks, -held_tokens, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    blocks = tokens = live = 0
    best = (0, 0, 0, 0.0)
    for t, db, dt, ds in events:
        blocks, tokens, live = blocks + db, tokens + dt, live + ds
        if blocks > best[0]:
            best = (blocks, tokens, live, t)
    return WorkingSet(best[0] + (shared if best[0] else 0), best[1], best[2], best[3], block_size)


def working_set_advice(ws: WorkingSet, cache: dict[str, Any] | None) -> dict[str, Any]:
    """The working set against the server's cache, and the KV memory that holds it."""
    cache = cache or {}
    blocks, kv_bytes = cache.get("num_blocks"), cache.get("kv_cache_memory_bytes")
    out: dict[str, Any] = ws.to_dict() | {"cache_blocks": blocks, "fits": None,
                                          "advised_kv_cache_memory_bytes": None}  # fmt: skip
    if isinstance(blocks, int | float) and blocks > 0:
        out["fits"] = ws.advised_blocks <= blocks
        if isinstance(kv_bytes, int | float) and kv_bytes > 0:
            per_block = kv_bytes / blocks
            out["advised_kv_cache_memory_bytes"] = math.ceil(ws.advised_blocks * per_block)
    return out


def render_working_set(adv: dict[str, Any]) -> str:
    """One paragraph for the terminal: the arithmetic, then the advice."""
    text = (
        f"working set: {adv['sessions_at_peak']} live sessions held {adv['peak_tokens']:,} "
        f"tokens of context at once ({adv['peak_blocks']:,} blocks of {adv['block_size']}); "
        f"with a tenth more and the null block, {adv['advised_blocks']:,} blocks keep every "
        "conversation cached"
    )
    if adv["cache_blocks"] is None:
        return text + " (the server does not say its cache's size)"
    text += f"; the cache has {adv['cache_blocks']:,}"
    if adv["fits"]:
        return text + ": it holds them"
    need = adv["advised_kv_cache_memory_bytes"]
    more = f": give it --kv-cache-memory-bytes {need}" if need else ": give it more KV memory"
    return text + more + " (or fewer live sessions per replica, or a CPU offload tier)"
