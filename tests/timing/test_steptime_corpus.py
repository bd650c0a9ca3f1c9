"""The step model against public real-GPU vLLM figures (bench/corpus/steptime.jsonl).

The shipped constants were fitted on the corpus's fit part (bench/bench_steptime_corpus.py);
here they are held to the held-out part, which the fit never saw, and the corpus to its own
rules: every figure has a source and a quote, runs are split whole, the judge set the issue
keeps aside is not in it. docs/twin.md has the tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvwatch.timing.fit import Bound, errors, fit, summary
from kvwatch.timing.steptime import StepConstants

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from steptime_corpus import CORPUS, read, split_of  # noqa: E402

ROWS = [json.loads(x) for x in CORPUS.read_text().splitlines() if x.strip()]


def test_every_figure_names_its_source_and_quotes_it() -> None:
    assert len(ROWS) >= 40
    for r in ROWS:
        assert r["source_url"] or (r["source_repo"] and r["source_path"]), r["id"]
        assert r["quote"].strip(), r["id"]
        assert r["split"] == split_of(r), r["id"]
    assert len({r["id"] for r in ROWS}) == len(ROWS)


def test_runs_are_split_whole_and_both_parts_are_there() -> None:
    by_run: dict[str, set[str]] = {}
    for r in ROWS:
        by_run.setdefault(str(r.get("run") or r["id"]), set()).add(r["split"])
    assert all(len(s) == 1 for s in by_run.values())
    held = [r for r in ROWS if r["split"] == "held_out"]
    assert 0.2 < len(held) / len(ROWS) < 0.45


def test_the_judge_set_is_kept_out() -> None:
    for r in ROWS:
        m, c = r["model"].lower(), r["batch_or_concurrency"]
        assert not ("gpt-oss-120b" in m and r["gpu"] == "h100" and c in (4, 64)), r["id"]
        assert not ("deepseek-r1" in m and r["gpu"] == "h200" and r["tp"] == 8 and c == 4)


def test_the_shipped_constants_hold_on_the_held_out_part() -> None:
    points = read()
    held = [p for p in points if p.split == "held_out"]
    fitted = [p for p in points if p.split == "fit"]
    h = summary(errors([p.predict(StepConstants()) for p in held], [p.value for p in held]))
    f = summary(errors([p.predict(StepConstants()) for p in fitted], [p.value for p in fitted]))
    print(f"held out: {h}\nfitted: {f}")
    # what the shipped model reaches (docs/twin.md, 2026-12-06): fitted 5.7%, held out 11.0%
    # median; the target for the held-out part (<= 10%, none past 25%) is not yet met,
    # and docs/twin.md names the points past it. These bounds keep what was reached.
    assert h["median_abs"] <= 0.13
    assert abs(h["mean"]) <= 0.10  # no longer too fast on average (was -31%)
    assert f["median_abs"] <= 0.08


def test_the_fit_recovers_constants_it_is_given() -> None:
    """The fitter is not circular: figures made with known constants give them back."""
    points = [p for p in read() if p.split == "fit"][:25]
    truth = {"step_overhead_s": 0.0009, "kv_efficiency": 0.55}
    made = [p.predict(StepConstants.with_overrides(truth)) for p in points]

    def predict(values: dict[str, float]) -> list[float]:
        return [p.predict(StepConstants.with_overrides(values)) for p in points]

    got = fit(
        [Bound("step_overhead_s", 0.0005, 1e-5, 0.01), Bound("kv_efficiency", 1.0, 0.1, 2.0)],
        predict,
        made,
    )
    for k, v in truth.items():
        assert got.values[k] == pytest.approx(v, rel=0.02), k
