"""Numbered blocks of token ids: the same ids wherever a number appears, different numbers never
starting alike. Trace replay builds prompts from the trace's `hash_ids` with them, sessions
their unique openings and shared system prompts, so that a server's prefix cache sees exactly
the sharing the load means and no other.

Block `h` is `h` written in tokens of the server-tokenized corpus, then corpus text from a place
`h` and the seed choose. Slicing keeps a block cheap to build just before its request is due.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["TokenBlocks", "MIN_ALPHABET", "ID_LIMIT"]

ID_LIMIT = 2**42  # numbers below this are written apart
MIN_ALPHABET = 64  # distinct corpus tokens: a number then takes at most 7 of a block's tokens


class TokenBlocks:
    def __init__(self, tokens: Sequence[int], seed: int = 0) -> None:
        alphabet = sorted(set(tokens))
        if len(alphabet) < MIN_ALPHABET:
            raise ValueError(
                f"the tokenized corpus has {len(alphabet)} distinct tokens: numbered blocks "
                f"need {MIN_ALPHABET}"
            )
        self.tokens, self.alphabet, self.seed = list(tokens), alphabet, seed
        self.digits = math.ceil(math.log2(ID_LIMIT) / math.log2(len(alphabet)))

    def block(self, h: int, n: int) -> list[int]:
        """The first `n` tokens of block `h`."""
        if not 0 <= h < ID_LIMIT:
            raise ValueError(f"block number {h} is outside 0..2**42")
        v = len(self.alphabet)
        digits, x = [], h
        for _ in range(self.digits):
            digits.append(self.alphabet[x % v])
            x //= v
        start = random.Random(h * 1_000_003 + self.seed).randrange(len(self.tokens))
        body: list[int] = []
        while len(digits) + len(body) < n:
            body.extend(self.tokens[start : start + n - len(digits) - len(body)])
            start = 0
        return (digits + body)[:n]

    def text(self, rng: random.Random, n: int) -> list[int]:
        """`n` tokens of corpus text from a place `rng` chooses (a user's message, a tool's
        result): unnumbered, so only what comes before it makes it unique."""
        start = rng.randrange(len(self.tokens))
        out: list[int] = []
        while len(out) < n:
            out.extend(self.tokens[start : start + n - len(out)])
            start = 0
        return out
