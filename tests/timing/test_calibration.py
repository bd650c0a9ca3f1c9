"""Calibration from a deployment's own figures (timing/calibration.py, `kvwatch calibrate`):
the fit gives back hidden constants, names what its loads cannot pin, and its file is checked
where it enters. The live proof on the real vLLM is tests/timing/test_calibrate_live.py; the
bench is bench/bench_calibrate.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.calibration import (
    FORMAT,
    SERVER_ROBUST,
    CalibrationError,
    Figure,
    calibrate,
    calibration_from_json,
    read_calibration,
)
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.steptime import StepConstants, StepModel

LLAMA = lookup_model("llama-3.1-8b")
H100 = lookup_gpu("h100")


def _figures(constants: StepConstants, streams: tuple[int, ...], prompts: tuple[int, ...]):
    m = StepModel(LLAMA, H100, constants=constants)
    out = []
    for c in streams:
        for p in prompts:
            load = Load("fixed_concurrency", c, p, 256, 8192, 1024)
            for metric in ("tpot_s", "ttft_s"):
                out.append(Figure(f"{c} x {p}", load, metric, predict(m, load, metric)))
    return out


def test_hidden_constants_moved_40_percent_come_back_within_5_percent() -> None:
    base = StepModel(LLAMA, H100)
    hidden = {
        "hbm_efficiency": base.hbm_efficiency * 1.2,  # +40% would pass 1.0: a card's ceiling
        "kv_efficiency": base.constants.kv_efficiency * 0.6,
        "mfu": base.mfu * 0.6,
        "step_overhead_s": base.constants.step_overhead_s * 1.4,
    }
    figs = _figures(StepConstants.with_overrides(hidden), (1, 8, 32, 128), (512, 4096))
    cal = calibrate(LLAMA, H100, 1, "auto", figs, "synthetic")
    for k in ("hbm_efficiency", "kv_efficiency", "mfu"):
        assert cal.constants[k] == pytest.approx(hidden[k], rel=0.05), k
    # one model's weights over the bandwidth and the fixed cost of a step add to every step
    # alike: the figures cannot tell them apart, so the bandwidth's efficiency takes both
    assert "as hbm_efficiency does" in cal.not_pinned["step_overhead_s"]
    assert cal.error["max_abs"] < 0.02
    assert cal.seen["concurrency"] == [1, 128]
    assert cal.outside(512, 512, 256) == ["concurrency 512 is outside the 1-128 calibrated on"]
    assert cal.outside(64, 1024, 256) == []


def test_a_servers_stray_slice_pulls_the_constants_less() -> None:
    """A server's figures are slices of traffic nobody controlled: one may read a wave's
    prefill inside its token gaps. One TPOT of 16 three times too slow (32 x 512) moves
    `kv_efficiency` 19% under least squares; the server sources' soft-L1 loss keeps every
    constant within 6% (measured: 5.8%). It lessens such a pull, it does not remove it
    (docs/twin.md has two and three strays)."""
    base = StepModel(LLAMA, H100)
    hidden = {"hbm_efficiency": base.hbm_efficiency * 0.8, "mfu": base.mfu * 1.4,
              "kv_efficiency": base.constants.kv_efficiency * 1.4}  # fmt: skip
    figs = _figures(StepConstants.with_overrides(hidden), (1, 8, 32, 128), (512, 4096))
    figs[8] = Figure(figs[8].label, figs[8].load, figs[8].metric, figs[8].value * 3)
    assert (figs[8].load.concurrency, figs[8].load.input_len, figs[8].metric) == (32, 512, "tpot_s")
    plain = calibrate(LLAMA, H100, 1, "auto", figs, "slices")
    robust = calibrate(LLAMA, H100, 1, "auto", figs, "slices", robust=SERVER_ROBUST)
    assert max(abs(plain.constants[k] / v - 1) for k, v in hidden.items()) > 0.15
    for k, v in hidden.items():
        assert robust.constants[k] == pytest.approx(v, rel=0.06), k


def test_what_the_loads_cannot_pin_is_named_and_left_at_its_default() -> None:
    figs = _figures(StepConstants(), (1, 2), (512,))
    cal = calibrate(LLAMA, H100, 1, "auto", figs, "never above batch 2")
    # a few us a request are nothing beside an 8 ms step of two: named, not fitted
    assert "request_overhead_s" in cal.not_pinned
    assert "request_overhead_s" not in cal.constants
    assert "1-2 streams" in cal.not_pinned["request_overhead_s"]


def test_one_load_cannot_calibrate() -> None:
    figs = _figures(StepConstants(), (8,), (512,))  # TPOT and TTFT of one load: not enough
    with pytest.raises(CalibrationError, match="needs loads at two concurrencies"):
        calibrate(LLAMA, H100, 1, "auto", figs, "one stage")


def test_a_cpu_without_a_data_sheet_gets_its_own_bandwidth_and_flops() -> None:
    cpu = lookup_gpu("cpu")
    truth = {"hbm_bytes_per_s": 3e10, "flops": 4e11, "overlap": 0.3, "step_overhead_s": 0.004}
    m = StepModel(LLAMA, cpu, constants=StepConstants.with_overrides(truth))
    figs = []
    for c in (1, 4, 16):
        load = Load("fixed_concurrency", c, 128, 64, 2048, 256)
        for metric in ("tpot_s", "ttft_s", "output_tok_s"):
            figs.append(Figure(str(c), load, metric, predict(m, load, metric)))
    cal = calibrate(LLAMA, cpu, 1, "auto", figs, "synthetic cpu")
    assert {"hbm_bytes_per_s", "flops"} <= set(cal.constants)
    again = StepModel(LLAMA, cpu, constants=cal.step_constants())
    for f in figs:
        assert predict(again, f.load, f.metric) == pytest.approx(f.value, rel=0.03)


def _doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "format": FORMAT, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1,
        "constants": {"hbm_efficiency": 0.8}, "seen": {"concurrency": [1, 64]},
    }  # fmt: skip
    doc.update(over)
    return doc


def test_the_file_is_checked_where_it_enters(tmp_path: Path) -> None:
    ok = tmp_path / "cal.json"
    ok.write_text(json.dumps(_doc()))
    assert read_calibration(ok).step_constants().hbm_efficiency == 0.8
    bad = [
        ("[]", "is not a kvwatch calibration"),
        ("{", "is not JSON"),
        (json.dumps(_doc(format="other")), "is not a kvwatch calibration"),
        (json.dumps(_doc(constants={"speed": 1})), "unknown step-time constants: speed"),
        (json.dumps(_doc(constants={"mfu": -1})), "finite non-negative"),
        (json.dumps(_doc(tp=0)), "not a usable calibration"),
        (json.dumps(_doc(seen={"concurrency": [5, 1]})), "not a usable calibration"),
        (json.dumps(_doc(model=None)), "not a usable calibration"),
    ]
    for text, msg in bad:
        ok.write_text(text)
        with pytest.raises(CalibrationError, match=msg) as e:
            read_calibration(ok)
        assert "\n" not in str(e.value) and len(str(e.value)) < 400
    with pytest.raises(CalibrationError, match="cannot read"):
        read_calibration(tmp_path / "missing.json")
    # NaN arrives as a JSON number through Python's json: refused by the step model's check
    with pytest.raises(CalibrationError):
        calibration_from_json(_doc(constants={"mfu": float("nan")}), "x")


def _kvwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvwatch", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_what_if_predicts_with_a_calibration_and_names_what_it_extrapolates(
    tmp_path: Path,
) -> None:
    figs = _figures(StepConstants(), (1, 8, 32), (512,))
    cal = calibrate(LLAMA, H100, 1, "auto", figs, "synthetic")
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(cal.to_dict()))
    args = ["advise", "--what-if", "--model", "llama-3.1-8b", "--max-model-len", "4096",
            "--kv-cache-memory-bytes", str(40 * 2**30), "--prompt-len", "512",
            "--output-len", "256", "--calibration", str(f)]  # fmt: skip
    p = _kvwatch(*args, "--gpu", "h100", "--concurrency", "512", "--json")
    assert p.returncode in (0, 1), p.stderr
    (item,) = json.loads(p.stdout)
    w = item["what_if"]
    assert w["step_time_source"].startswith(f"calibration {f}")
    assert w["step_time_notes"] == ["concurrency 512 is outside the 1-32 calibrated on"]
    p = _kvwatch(*args, "--gpu", "h200", "--concurrency", "8")
    assert p.returncode == 2
    assert p.stderr.strip().endswith("calibrates h100, not h200; calibrate this device")


def test_calibrate_says_in_one_line_what_it_cannot_read(tmp_path: Path) -> None:
    p = _kvwatch("calibrate", "--run", str(tmp_path / "nope"), "--model", "llama-3.1-8b",
                 "--gpu", "h100")  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "is not a run directory" in p.stderr
    p = _kvwatch("calibrate", "--run", str(tmp_path), "--model", "llama-3.1-8b", "--gpu",
                 "h100", "--tp", "0")  # fmt: skip
    assert p.returncode == 2 and "--tp: must be a whole number, at least 1" in p.stderr


def test_hostile_run_files_give_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A hand-edited run directory: timings that are text, NaN, negative or missing, and a
    stage that claims a billion streams; calibrate skips what it cannot use and says why."""
    run = tmp_path / "run"
    run.mkdir()
    stages = [{"name": "s", "pattern": "Concurrency(n=1000000000)"},
              {"name": "t", "pattern": "Concurrency(n=2)"}]  # fmt: skip
    (run / "spec.json").write_text(json.dumps({"stages": stages}))
    (run / "summary.json").write_text(json.dumps({"overall": {}, "time_scale": "fast"}))
    rows = []
    for i, tpot in enumerate(["x", float("nan"), -1.0, None, 0.01, 0.01, 0.01, 0.01, 0.01]):
        for stage in ("s", "t"):
            rows.append(
                {
                    "stage": stage,
                    "ok": True,
                    "sent_at": i,
                    "finished_at": i + 1.5,
                    "prompt_tokens": 64,
                    "output_tokens": 32,
                    "tpot": tpot,
                    "ttft": 0.05,
                }
            )
    (run / "requests.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows).replace("NaN", "NaN") + "\n"
    )
    p = _kvwatch("calibrate", "--run", str(run), "--model", "llama-3.1-8b", "--gpu", "h100")
    assert p.returncode == 2, p.stdout
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def _closed_loop_run(run: Path, streams: int, offsets: list[float], cycles: int = 12) -> Path:
    """A run of one closed-loop stage: stream i sends at each whole second plus offsets[i]
    and is answered 0.9 s later (TTFT 50 ms)."""
    run.mkdir()
    stage = {"name": "main", "pattern": f"Concurrency(n={streams})"}
    (run / "spec.json").write_text(json.dumps({"stages": [stage]}))
    (run / "summary.json").write_text(json.dumps({"overall": {}, "time_scale": 1.0}))
    rows = [
        {"stage": "main", "ok": True, "sent_at": k + offsets[i], "finished_at": k + offsets[i]
         + 0.9, "prompt_tokens": 512, "output_tokens": 128, "tpot": 0.0067, "ttft": 0.05}
        for k in range(cycles) for i in range(streams)
    ]  # fmt: skip
    (run / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_a_runs_streams_in_step_or_apart_are_read_as_such(tmp_path: Path) -> None:
    """Streams started together stay in step unless something spreads them (the twin's async
    scheduling spread 64 streams: TTFT 0.33 s where one wave's prefill takes 1.08 s); the run
    says which from when its requests were sent, and the figure is predicted so."""
    from kvwatch.advise.calibrate import figures_from_run

    together, _, _ = figures_from_run(_closed_loop_run(tmp_path / "a", 8, [0.0] * 8), 8192, 1024)
    assert {f.load.wave for f in together} == {0} and "waves" not in together[0].label
    apart, _, _ = figures_from_run(
        _closed_loop_run(tmp_path / "b", 8, [i / 8 for i in range(8)]), 8192, 1024
    )  # fmt: skip
    assert {f.load.wave for f in apart} == {1}
    assert apart[0].label == "main: 8 streams of 512 + 128 tokens in waves of 1"
    # eleven in step and one apart: a wave of about ten, as a request sees it
    mixed, _, _ = figures_from_run(
        _closed_loop_run(tmp_path / "c", 12, [0.0] * 11 + [0.5]), 8192, 1024
    )  # fmt: skip
    assert {f.load.wave for f in mixed} == {10}
    # a stage too short to hold two whole waves past its start (the twin's 64 streams with 160
    # requests held one) is read as it started, in step
    short, _, _ = figures_from_run(
        _closed_loop_run(tmp_path / "d", 8, [0.0] * 7 + [0.5], cycles=3), 8192, 1024
    )  # fmt: skip
    assert {f.load.wave for f in short} == {0}
    m = StepModel(LLAMA, H100)
    ttft = {f.load.wave: predict(m, f.load, "ttft_s") for f in together + apart}
    assert ttft[1] < ttft[0]
