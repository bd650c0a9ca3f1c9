"""How long to wait before trying again: the webhook sender's next attempt and a supervised
loop's restart share one rule, so a dead receiver and a crashing loop back off alike."""

from __future__ import annotations

import random

__all__ = ["backoff_s"]


def backoff_s(
    attempts: int, base: float = 1.0, cap: float = 300.0, rng: random.Random | None = None
) -> float:
    """Exponential backoff with full jitter on the upper half: [d/2, d], d = base x 2^attempts."""
    d = min(cap, base * 2.0 ** max(0, attempts - 1))
    draw = rng.random() if rng is not None else random.random()
    return d / 2 + draw * d / 2
