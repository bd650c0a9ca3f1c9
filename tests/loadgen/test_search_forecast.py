"""`loadgen search --calibration`: the forecast said before probing (kvwatch/timing/
search_forecast.py, loadgen/forecast.py). Pure: a calibration, a cache and lengths in, the
onset, the SLO limit and what binds out, each held to the closed loop's own arithmetic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.loadgen.forecast import forecast_doc, forecast_line, mean_lengths, render_forecast
from kvwatch.loadgen.workload.spec import WorkloadSpec
from kvwatch.sizing.budget import default_max_num_seqs
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for
from kvwatch.timing.calibration import Calibration
from kvwatch.timing.loadmodel import steady_loop
from kvwatch.timing.search_forecast import forecast_search
from kvwatch.timing.steptime import StepModel

PROMPT, OUTPUT = 512, 128


def _setup() -> tuple[StepModel, object, int]:
    arch, gpu = lookup_model("llama-3.1-8b"), lookup_gpu("h100")
    layout = layout_for(arch, Serving(PROMPT + OUTPUT), PLATFORMS[gpu.platform])
    return StepModel(arch, gpu), layout, 40 * 40 + 1  # 40 blocks a stream at 639 tokens; 40 fit


def _forecast(slo: dict[str, float], max_load: int = 256):  # type: ignore[no-untyped-def]
    steps, layout, blocks = _setup()
    gpu = lookup_gpu("h100")
    return forecast_search(
        steps, layout, blocks, gpu.batched_tokens, default_max_num_seqs(gpu), PROMPT, OUTPUT, slo,
        max_load,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_loose_slo_is_bound_by_the_cache() -> None:
    f = _forecast({"tpot": 10.0})
    assert f.kv_onset == 41 and f.slo_limit == 40 and f.binding == "kv"
    assert f.at_limit["tpot"] > 0 and f.at_limit["output_tok_s"] > 0


def test_a_tight_slo_is_bound_by_compute_where_the_loop_crosses_it() -> None:
    steps, _, _ = _setup()
    gpu = lookup_gpu("h100")
    tpot = {
        c: steady_loop(steps, c, PROMPT, OUTPUT, gpu.batched_tokens, 1024).tpot_s for c in (8, 9)
    }  # fmt: skip
    limit = (tpot[8] + tpot[9]) / 2  # between 8 and 9 streams' TPOT
    f = _forecast({"tpot": limit})
    assert f.slo_limit == 8 and f.binding == "compute"
    f = _forecast({"tpot": steps.seconds([]) + 1e-9})  # below one stream's TPOT
    assert f.slo_limit is None and f.binding == "compute"


def test_a_search_that_stops_short_sees_neither() -> None:
    f = _forecast({"tpot": 10.0}, max_load=16)
    assert f.slo_limit == 16 and f.binding == "none" and f.kv_onset is None
    assert _forecast({"ttft_from_scheduled": 1.0, "tpot": 10.0}).unforecast == [
        "ttft_from_scheduled"
    ]


def _cal(time_base: str = "wall") -> Calibration:
    return Calibration(
        "llama-3.1-8b", "h100", 1, {"hbm_efficiency": 0.8}, {}, "test", time_base,
        {"concurrency": [1.0, 16.0]}, [], {},
    )  # fmt: skip


def test_the_doc_puts_a_twins_seconds_in_wall_time() -> None:
    cache = {"num_blocks": 40 * 40 + 1, "block_size": 16}
    wall = forecast_doc(_cal(), Path("c.json"), cache, (PROMPT, OUTPUT), {"tpot": 10.0}, 64, None)
    assert wall["slo_limit"] == 40 and wall["outside_calibration"]  # 40 streams: past 16
    sim = _cal("the twin's simulated seconds")
    lengths = (PROMPT, OUTPUT)
    twin = forecast_doc(sim, Path("c.json"), cache, lengths, {"tpot": 10.0}, 64, 2.0)
    assert twin["at_limit"]["tpot"] == pytest.approx(2 * wall["at_limit"]["tpot"])
    assert twin["at_limit"]["output_tok_s"] == pytest.approx(wall["at_limit"]["output_tok_s"] / 2)
    with pytest.raises(SizingError, match="no time scale"):
        forecast_doc(sim, Path("c.json"), cache, lengths, {}, 8, None)
    text = render_forecast(wall)
    assert "KV onset: 41 streams" in text and "SLO limit: at least 40 streams (binding: kv" in text
    found = {"max_ok": {"load": 32.0}, "kv_onset": None}
    assert forecast_line(wall, found) == (
        "forecast vs found: SLO limit 40 vs 32 streams; KV onset 41 vs none"
    )


def test_mean_lengths_of_a_workload() -> None:
    assert mean_lengths(WorkloadSpec("128", "32")) == (128, 32)


def test_the_served_model_wins_and_neither_is_refused_in_one_line() -> None:
    cache = {"num_blocks": 40 * 40 + 1, "block_size": 16}
    lengths = (PROMPT, OUTPUT)
    other = Calibration(
        "tiny-llama-30m-v1", "h100", 1, {}, {}, "t", "wall", {}, [], {}
    )  # the name a calibration keeps of a local checkpoint: not a preset
    doc = forecast_doc(other, Path("c"), cache, lengths, {"tpot": 10.0}, 64, None, "llama-3.1-8b")
    assert doc["kv_onset"] == 41
    with pytest.raises(SizingError, match="neither the served model 'x'") as e:
        forecast_doc(other, Path("c"), cache, lengths, {}, 8, None, "x")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cache", [{"num_blocks": -3, "block_size": 16},
                                   {"num_blocks": "many", "block_size": 16},
                                   {"num_blocks": 100, "block_size": True}, {}])  # fmt: skip
def test_a_cache_no_server_has_is_refused_in_one_line(cache: dict[str, object]) -> None:
    with pytest.raises(SizingError, match="no cache"):
        forecast_doc(_cal(), Path("c"), cache, (PROMPT, OUTPUT), {}, 8, None)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--calibration", "/nonexistent/cal.json"], "--calibration: cannot read"),
        (["--calibration", "cal.json", "--by", "rate"], "forecasts closed loops"),
    ],
)
def test_a_calibration_is_refused_before_the_server_is_asked(
    extra: list[str], says: str, tmp_path: Path
) -> None:
    # the URL answers nothing: were the server asked first, the exit would be 3 (unreachable)
    argv = [sys.executable, "-m", "kvwatch", "loadgen", "search", "--url", "http://127.0.0.1:9",
            "--slo", "tpot=1s", "--run-dir", str(tmp_path / "s"), *extra]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
