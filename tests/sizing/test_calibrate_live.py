"""`kvwatch calibrate` on the real vLLM (CPU), not circular: calibrated on one load (1, 4 and 8
streams), it predicts two loads it never saw (6 and 12 streams), rerun; the bench also holds
it to another prompt length.
The bench (bench/bench_calibrate.py cpu, a larger cache and longer runs) holds TPOT and tokens/s
to 10% (docs/twin.md). Here, on the session's shared 40-block server and short runs, 30%: the
same load run twice differs by 10-15% on this machine, in the calibration and in the rerun
alike (in five local runs the worst figure read -20% once), and a wrong model misses by far
more (a TTFT read as the stream's own prompt instead of the wave's missed by 60-180%)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from bench_calibrate import prove  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_calibration_predicts_loads_it_never_saw(
    vllm_server: object, tiny_model: Path, tmp_path: Path
) -> None:
    url = vllm_server.base_url  # type: ignore[attr-defined]
    calib = (("--sweep", "concurrency=1,4,8", "--requests", "24",
              "--input-len", "64", "--output-len", "32"),)  # fmt: skip
    reruns = {"6 streams": (6, 64, 30), "12 streams": (12, 64, 40)}
    out = prove(url, tmp_path, str(tiny_model), "cpu", calib, reruns, 32)
    cal = out["calibration"]
    assert {"hbm_bytes_per_s", "flops"} <= set(cal["constants"])
    assert cal["error"]["median_abs"] < 0.10
    assert {r["metric"] for r in out["reruns"]} == {"tpot_s", "output_tok_s"}
    for r in out["reruns"]:
        assert abs(r["error"]) < 0.30, r
