"""Priority classes: each request carries the OpenAI API's `priority` field, which vLLM reads
under `--scheduling-policy priority` (lower runs first; the running request with the highest
value, the latest arrival among equals, is the one preempted). Under vLLM's default FCFS policy
the field is carried and ignored.

`--priorities 0:0.2,1:0.8`: class 0 for a fifth of the requests (or sessions), class 1 for the
rest, drawn from the run's seed apart from the prompts, so adding classes does not change what
is sent.
"""

from __future__ import annotations

import random

from kvwatch.loadgen.workload.lengths import DatasetError

__all__ = ["Classes", "parse_priorities", "draw_priority"]

Classes = tuple[tuple[int, float], ...]  # (priority, share)


def parse_priorities(spec: str) -> Classes:
    out: list[tuple[int, float]] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        prio, sep, share = part.partition(":")
        try:
            value, weight = int(prio), float(share) if sep else 1.0
        except ValueError:
            raise DatasetError(
                f"--priorities {spec!r}: use PRIORITY:SHARE,... (e.g. 0:0.2,1:0.8)"
            ) from None
        if not weight > 0 or weight == float("inf"):
            raise DatasetError(f"--priorities {spec!r}: shares must be positive numbers")
        if not -(2**63) <= value < 2**63:  # vLLM's is 64 bits: outside, every request got a 400
            raise DatasetError(f"--priorities {spec[:60]!r}: a priority must fit 64 bits")
        out.append((value, weight))
    if not out:
        raise DatasetError(f"--priorities {spec!r}: name at least one class")
    if len({p for p, _ in out}) != len(out):
        raise DatasetError(f"--priorities {spec!r}: a class named twice")
    return tuple(out)


def draw_priority(rng: random.Random, classes: Classes) -> int:
    prios, weights = zip(*classes, strict=True)
    return int(rng.choices(prios, weights)[0])
