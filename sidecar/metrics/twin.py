"""The time scale a kvwatch twin declares on its /metrics, read by whatever judges it.

A twin at time scale K stretches every simulated duration K times on the wall clock: a latency
K times the card's, a rate 1/K of it. The line is the twin's own (`kvwatch_twin_time_scale`,
sidecar/contract/twin_metrics.py); a real vLLM has none, which reads as None (wall time is the
server's time). A value that is not a finite number in (0, 1000] is refused, not trusted.
"""

from __future__ import annotations

import math

from kvwatch.sidecar.contract.twin_metrics import TWIN_METRICS

__all__ = ["read_time_scale", "MAX_TIME_SCALE"]

MAX_TIME_SCALE = 1000.0


def read_time_scale(exposition: str) -> float | None:
    name = TWIN_METRICS.time_scale
    for line in exposition.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        try:
            k = float(value)
        except ValueError:
            return None
        return k if math.isfinite(k) and 0 < k <= MAX_TIME_SCALE else None
    return None
