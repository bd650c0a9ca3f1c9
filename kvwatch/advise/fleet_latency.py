"""With `advise --prometheus --calibration FILE`: what a fleet's advised replica count means
for latency. The fleet's advice counts KV only; at the advised engines each holds its share of
the peak's requests, and the calibrated step model says what a decode step of that many
requests at their mean final size takes (an upper bound of their TPOT between prefills: a
request decodes most of its output below its final size). Pure."""

from __future__ import annotations

import math
from pathlib import Path

from kvwatch.sizing.fleet import FleetAdvice, FleetObserved
from kvwatch.timing.calibration import Calibration
from kvwatch.timing.steptime import ScheduledRequest

__all__ = ["fleet_step_lines"]


def fleet_step_lines(
    cal: Calibration, path: Path, obs: FleetObserved, advice: FleetAdvice
) -> list[str]:
    """Arithmetic lines for the advice: the decode step at the advised engines' share."""
    engines = max(1, advice.replicas_needed)
    streams = max(1, math.ceil(obs.peak_requests / engines))
    size = max(1, round(obs.request_tokens))
    steps = cal.step_model(obs.model)
    step_s = steps.seconds([ScheduledRequest(1, size)] * streams)
    unit = "ms" if cal.time_base == "wall" else f"ms ({cal.time_base})"
    lines = [
        f"at {engines} engines, {streams:,} requests each at the peak: a decode step of them at "
        f"{size:,} tokens takes {step_s * 1e3:,.1f} {unit} (calibration {path}, {cal.source}), "
        f"at most {streams / step_s:,.0f} output tokens/s an engine"
    ]
    if cal.model != obs.model:
        lines.append(
            f"  calibrated on {cal.model}; the fleet serves {obs.model} (its layers where kvwatch "
            "can read them)"
        )
    lines += [f"  extrapolated: {x}" for x in cal.outside(streams, size, 1)[:2]]
    return lines
