"""The names the kvwatch twin exports beside vLLM's metrics, read by the sidecar and loadgen.

A twin stretches every simulated duration by its time scale K; whatever reads its /metrics must
know K before it judges a rate or a latency, so the name lives here, in the one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TwinMetricNames", "TWIN_METRICS"]


@dataclass(frozen=True)
class TwinMetricNames:
    info: str = "kvwatch_twin_info"
    time_scale: str = "kvwatch_twin_time_scale"
    busy_share: str = "kvwatch_twin_busy_share"
    behind_share: str = "kvwatch_twin_behind_share"
    simulated_seconds: str = "kvwatch_twin_simulated_seconds"  # a counter: `_total` on the wire
    behind_seconds: str = "kvwatch_twin_behind_seconds"
    steps: str = "kvwatch_twin_steps"


TWIN_METRICS = TwinMetricNames()
