"""`advise --prometheus --calibration`: the fleet's advised engines, in step time (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.advise.fleet_latency import fleet_step_lines
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.fleet import FleetObserved, advise_fleet
from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.calibration import Calibration
from kvwatch.timing.steptime import ScheduledRequest, StepModel


def _cal(model: str = "llama-3.1-8b") -> Calibration:
    return Calibration(model, "h100", 1, {"hbm_efficiency": 0.7}, {}, "run r1", "wall",
                       {"concurrency": [1.0, 16.0]}, [], {})  # fmt: skip


def test_the_advised_engines_share_in_step_time() -> None:
    obs = FleetObserved("llama-3.1-8b", 2, 200_000.0, 300.0, 1_500.0, 0.0, 120.0, "1h")
    advice = advise_fleet(obs, 0.9)
    assert advice.replicas_needed == 5  # 450,000 tokens / 90,000 an engine
    lines = fleet_step_lines(_cal(), Path("cal.json"), obs, advice)
    steps = StepModel(lookup_model("llama-3.1-8b"), lookup_gpu("h100"),
                      constants=_cal().step_constants())  # fmt: skip
    want = steps.seconds([ScheduledRequest(1, 1_500)] * 60)
    assert f"{want * 1e3:,.1f} ms" in lines[0] and "60 requests each" in lines[0]
    assert f"{60 / want:,.0f} output tokens/s" in lines[0]
    assert any("60 is outside the 1-16" in x for x in lines)  # extrapolated, and said


def test_another_model_is_named() -> None:
    obs = FleetObserved("served-name", 1, 90_000.0, 10.0, 1_000.0, 0.0, 0.0, "1h")
    lines = fleet_step_lines(_cal(), Path("c"), obs, advise_fleet(obs, 0.9))
    assert any("calibrated on llama-3.1-8b; the fleet serves served-name" in x for x in lines)
    with pytest.raises(SizingError, match="neither the served model"):
        fleet_step_lines(_cal("no-such-model"), Path("c"), obs, advise_fleet(obs, 0.9))
