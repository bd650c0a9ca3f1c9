"""Token-exact prompts for a trace replay, sharing exactly the prefixes the trace's `hash_ids` say.

Block `h` of the trace is the same `block_tokens` token ids wherever it appears: a slice of the
server-tokenized corpus that starts with `h` written in corpus tokens (so two different ids never
start alike, and a prompt's first block decides whether it shares anything). A prompt is its
blocks in order, cut to its length; tokens past the last id are the request's own (a block
numbered from the request's row, above every trace id). Slicing keeps this cheap enough to build
each prompt just before it is due.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

from kvwatch.loadgen.trace import ReplayPlan, TraceError

__all__ = ["trace_prompts", "block_tokens_for"]

_ID_BITS = 42  # ids below 2**42 are written apart: trace ids are below 2**40 (trace.py)
_OWN_BASE = 2**41  # the request's own blocks are numbered from here
_MIN_ALPHABET = 64  # distinct corpus tokens: an id then takes at most 7 of a block's 8+


def _alphabet(tokens: Sequence[int]) -> list[int]:
    return sorted(set(tokens))


def block_tokens_for(h: int, n: int, tokens: Sequence[int], alphabet: Sequence[int],
                     seed: int) -> list[int]:  # fmt: skip
    """The first `n` tokens of block `h`: its id in corpus tokens, then corpus text from a
    place the id and the seed choose."""
    v = len(alphabet)
    digits, x = [], h
    for _ in range(math.ceil(_ID_BITS / math.log2(v))):
        digits.append(alphabet[x % v])
        x //= v
    start = random.Random(h * 1_000_003 + seed).randrange(len(tokens))
    body: list[int] = []
    while len(digits) + len(body) < n:
        body.extend(tokens[start : start + n - len(digits) - len(body)])
        start = 0
    return (digits + body)[:n]


def trace_prompts(plan: ReplayPlan, tokens: Sequence[int], seed: int = 0
                  ) -> Iterator[tuple[int, ...]]:  # fmt: skip
    """Each of the plan's requests' prompt token ids, in its order, then no more."""
    alphabet = _alphabet(tokens)
    if len(alphabet) < _MIN_ALPHABET:
        raise TraceError(
            f"the tokenized corpus has {len(alphabet)} distinct tokens: a trace's block ids "
            f"need {_MIN_ALPHABET}"
        )
    bt = plan.block_tokens
    for i, r in enumerate(plan.requests):
        ids: list[int] = []
        k = 0
        while len(ids) < r.input_tokens:
            h = r.hash_ids[k] if k < len(r.hash_ids) else _OWN_BASE + i * 4096 + k
            ids.extend(block_tokens_for(h, min(bt, r.input_tokens - len(ids)), tokens, alphabet,
                                        seed))  # fmt: skip
            k += 1
        yield tuple(ids)
