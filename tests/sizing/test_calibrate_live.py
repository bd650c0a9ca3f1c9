"""`kvwatch calibrate` on the real vLLM (CPU), not circular: calibrated on one load (1, 4 and 8
streams), it predicts two loads it never saw (6 and 12 streams), rerun; the bench also holds
it to another prompt length. Three sources calibrate from the same loads: their run
directories, the server's /metrics watched while they ran, and a real Prometheus that scraped
it every second.
The bench (bench/bench_calibrate.py cpu and cpu-metrics, a larger cache and longer runs)
holds them closer (docs/twin.md). Here, on the session's shared 40-block server and short
runs, 30% for the runs and 40% for the server's own counters: the same load run twice
differs by 10-15% on this machine, in the calibration and in the rerun alike (in five local
runs the worst figure read -20% once), a slice of a few seconds is noisier than a run's
steady state, and a wrong model misses by far more (a TTFT read as the stream's own prompt
instead of the wave's missed by 60-180%)."""

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
    lengths = ("--input-len", "64", "--output-len", "32")
    # stages long enough that a 3 s slice of the server's counters is one steady load
    calib = tuple(("--concurrency", str(c), "--requests", str(n), *lengths)
                  for c, n in ((1, 16), (4, 64), (8, 128)))  # fmt: skip
    reruns = {"6 streams": (6, 64, 30), "12 streams": (12, 64, 40)}
    sources = ("run", "metrics", "prometheus")
    out = prove(url, tmp_path, str(tiny_model), "cpu", calib, reruns, 32, sources)
    for source, limit in (("run", 0.30), ("metrics", 0.40), ("prometheus", 0.40)):
        got = out["by_source"][source]
        cal = got["calibration"]
        assert {"hbm_bytes_per_s", "flops"} <= set(cal["constants"]), source
        assert cal["error"]["median_abs"] < 0.15, (source, cal["error"])
        assert {r["metric"] for r in got["reruns"]} == {"tpot_s", "output_tok_s"}
        for r in got["reruns"]:
            assert abs(r["error"]) < limit, (source, r)
    # the server's own counters saw the loads the runs did
    for source in ("metrics", "prometheus"):
        seen = out["by_source"][source]["calibration"]["seen"]["concurrency"]
        assert seen[0] <= 2 and seen[1] >= 6, (source, seen)
