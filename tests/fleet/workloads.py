"""Workloads that show what routing does to a fleet, written as kvwatch-format traces (JSONL:
`t`, `input_tokens`, `output_tokens`, `hash_ids`) for `kvwatch loadgen run --trace`.

`session_pile_trace`: long conversations and short one-turn requests arriving in a fixed
order: every `replicas`-th request is the next turn of a long conversation (resending its
context, which grows a turn at a time), the rest are short. A round-robin router counts
requests, not tokens, so it sends every long turn to the same replica, which runs out of KV
while the others idle; a router that follows the cache (each turn resends its conversation,
whose prefix a replica holds) and balances on load spreads the conversations instead. The
arrival pattern is contrived only in being exact: a client that alternates a long call and
short ones (summarise, then classify) does the same to round robin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PileSpec", "session_pile_trace"]


@dataclass(frozen=True)
class PileSpec:
    replicas: int = 2
    rate: float = 4.0  # requests per second, all kinds
    duration_s: float = 90.0
    long_sessions: int = 6
    long_first_tokens: int = 2048  # a long conversation's first turn
    long_turn_tokens: int = 512  # what each later turn adds (the user's message + the answer)
    long_max_tokens: int = 4096  # it starts again past this (a new conversation, new prefix)
    short_tokens: int = 128
    short_output_tokens: int = 64
    output_tokens: int = 256  # a long conversation's answer
    block_tokens: int = 64  # tokens per hash id (pass as --trace-block-tokens)


def session_pile_trace(path: Path, spec: PileSpec) -> int:
    """Write the trace; returns the number of requests."""
    if spec.replicas < 2 or spec.rate <= 0 or spec.duration_s <= 0 or spec.long_sessions < 1:
        raise ValueError("a pile needs 2+ replicas, a rate, a duration and a long session")
    b = spec.block_tokens
    turns = [0] * spec.long_sessions  # turns sent so far, per long conversation
    generation = [0] * spec.long_sessions  # restarted conversations get a new prefix
    next_id = 0
    prefix: dict[tuple[int, int], int] = {}  # (session, generation) -> its first hash id
    n = int(spec.rate * spec.duration_s)
    rows = []
    for i in range(n):
        t = round(i / spec.rate, 6)
        if i % spec.replicas == 0:
            s = (i // spec.replicas) % spec.long_sessions
            tokens = spec.long_first_tokens + turns[s] * spec.long_turn_tokens
            if tokens > spec.long_max_tokens:
                turns[s], generation[s] = 0, generation[s] + 1
                tokens = spec.long_first_tokens
            key = (s, generation[s])
            if key not in prefix:
                prefix[key] = next_id
                next_id += spec.long_max_tokens // b + 1
            ids = list(range(prefix[key], prefix[key] + tokens // b))
            turns[s] += 1
            rows.append({"t": t, "input_tokens": tokens, "output_tokens": spec.output_tokens,
                         "hash_ids": ids})  # fmt: skip
        else:
            ids = list(range(next_id, next_id + spec.short_tokens // b))
            next_id += len(ids)
            rows.append({"t": t, "input_tokens": spec.short_tokens,
                         "output_tokens": spec.short_output_tokens, "hash_ids": ids})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return n
