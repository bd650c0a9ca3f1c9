"""Token-exact prompts for a trace replay, sharing exactly the prefixes the trace's `hash_ids` say.

Block `h` of the trace is numbered block `h` (loadgen/workload/token_blocks.py) wherever it
appears, so two different ids never start alike and a prompt's first block decides whether it
shares anything. A prompt is its blocks in order, cut to its length; tokens past the last id are
the request's own (a block numbered from the request's position, above every trace id).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvwatch.loadgen.workload.token_blocks import TokenBlocks
from kvwatch.loadgen.workload.trace import ReplayPlan, TraceError

__all__ = ["trace_prompts"]

_OWN_BASE = 2**41  # the request's own blocks are numbered from here (trace ids are below 2**40)


def trace_prompts(plan: ReplayPlan, tokens: Sequence[int], seed: int = 0
                  ) -> Iterator[tuple[int, ...]]:  # fmt: skip
    """Each of the plan's requests' prompt token ids, in its order, then no more."""
    try:
        blocks = TokenBlocks(tokens, seed)
    except ValueError as e:
        raise TraceError(str(e)) from None
    bt = plan.block_tokens
    for i, r in enumerate(plan.requests):
        ids: list[int] = []
        k = 0
        while len(ids) < r.input_tokens:
            h = r.hash_ids[k] if k < len(r.hash_ids) else _OWN_BASE + i * 4096 + k
            ids.extend(blocks.block(h, min(bt, r.input_tokens - len(ids))))
            k += 1
        yield tuple(ids)
