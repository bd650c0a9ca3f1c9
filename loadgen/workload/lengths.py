"""Length distributions for prompts, answers, turns and think times, as the flags give them:

300 | fixed:300 | uniform:100,300 | normal:200,50 | lognormal:200,0.5 (median, sigma)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["DatasetError", "LengthDist", "parse_length"]


# No model takes a prompt near this (the longest contexts are 10M tokens), and a prompt is
# built in memory before it is sent: 10^300 tokens asked for memory no machine has.
MAX_LENGTH = 10_000_000


class DatasetError(ValueError):
    """A dataset or length spec that cannot be used; says which file/line and why."""


@dataclass(frozen=True)
class LengthDist:
    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        """A whole number of tokens, 1 to MAX_LENGTH (a lognormal's tail is cut there)."""
        return max(1, round(min(self.draw(rng), MAX_LENGTH)))

    def draw(self, rng: random.Random) -> float:
        """The raw draw, for quantities that are not counts (think times); never below 0."""
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            v = rng.gauss(self.a, self.b)
        else:  # lognormal with median a and sigma b
            try:
                v = rng.lognormvariate(math.log(self.a), self.b)
            except OverflowError:  # a sigma of hundreds: past any float
                v = math.inf
        return max(0.0, min(v, MAX_LENGTH))


def parse_length(spec: str) -> LengthDist:
    kind, sep, rest = spec.partition(":")
    if not sep:
        kind, rest = "fixed", spec
    try:
        nums = [float(x) for x in rest.split(",")]
    except ValueError:
        raise DatasetError(f"length {spec!r}: numbers expected") from None
    want = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
    if kind not in want or len(nums) != want[kind]:
        raise DatasetError(
            f"length {spec!r}: use N, fixed:N, uniform:LO,HI, normal:MEAN,SD or "
            "lognormal:MEDIAN,SIGMA"
        )
    if not all(math.isfinite(x) for x in nums):
        # nan became a length of 1 and inf a traceback, or a think time that never ends
        raise DatasetError(f"length {spec!r}: numbers must be finite")
    if nums[0] <= 0 or (kind == "uniform" and nums[1] < nums[0]) or (len(nums) > 1 and nums[1] < 0):
        raise DatasetError(f"length {spec!r}: lengths must be positive (and LO <= HI)")
    if max(nums) > MAX_LENGTH:
        raise DatasetError(f"length {spec!r}: at most {MAX_LENGTH:,}")
    return LengthDist(kind, *nums)
