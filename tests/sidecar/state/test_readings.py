"""The sidecar's `GET /api/readings` (sidecar/contract/readings.py): what it has scraped of each
engine, as `kvwatch calibrate --sidecar` reads it. The parser's figures come from a real vLLM
body (tests/data); the endpoint is the sidecar's own, in process; the calibration from a live
sidecar is in tests/timing/test_calibrate_live.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kvwatch.advise.server_readings import from_sidecar
from kvwatch.common.cli_kit import CliError
from kvwatch.sidecar.contract.readings import (
    FIELDS,
    FORMAT,
    ReadingsError,
    readings_from_json,
)
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.outputs.exporter import serve
from kvwatch.sidecar.state.sidecar_state import SidecarState

MODEL = "/root/.cache/kvwatch/models/tiny-llama-30m-v1"


def _body(data_dir: Path) -> str:
    return (data_dir / "vllm-0.32-metrics-busy.txt").read_text()


def test_a_real_body_gives_the_counters_calibration_reads(data_dir: Path) -> None:
    obs = observe(parse_exposition(_body(data_dir)))[(MODEL, "0")]
    r = obs.calibration_reading(7.0, scale=2.0)
    assert r.t == 7.0
    assert r.held == 4 + 20  # running + waiting: the requests the server holds
    assert r.itl_count == 13276 and r.itl_sum == pytest.approx(429.4102602299998 / 2)
    assert r.prompt_count == 40 and r.prompt_sum == 647
    assert r.ttft_sum == pytest.approx(9.01470685005188 / 2)
    # what a busy span is read from: the engine's steps, the prompt tokens it computed (the
    # local ones, 0.32+), the tokens it generated
    assert r.steps == 2033 and r.prompt_computed == 1036 and r.generated == 13340


def _state(data_dir: Path, scale: float | None = None) -> SidecarState:
    body = _body(data_dir)
    state = SidecarState(["http://a"])
    for t in (1.0, 2.0, 3.0):
        exp = parse_exposition(body)
        state.record_scrape("http://a", t, ScrapeOutcome(0.01, exp, time_scale=scale))
    return state


def test_the_sidecars_readings_round_trip_through_the_endpoint(data_dir: Path) -> None:
    state = _state(data_dir)
    server = serve("127.0.0.1", 0, state.view, 60.0, readings=state.readings_json)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        doc = httpx.get(url + "/api/readings", timeout=5).json()
        assert doc["format"] == FORMAT and doc["fields"] == list(FIELDS)
        per_engine, scales = readings_from_json(doc)
        name = f"http://a {MODEL} engine 0"
        assert list(per_engine) == [name] and scales == {name: 1.0}
        assert [r.t for r in per_engine[name]] == [1.0, 2.0, 3.0]
        assert per_engine[name][0].itl_count == 13276
        # the same counters every scrape: no slice has gaps, each is left out with why
        slices, scale, notes = from_sidecar(url, 1.0)
        assert scale == 1.0 and len(slices[name]) == 2 and notes == []
        assert all(s.itl_count == 0 for s in slices[name])
    finally:
        server.shutdown()
        server.server_close()


def test_a_twins_readings_are_in_its_time(data_dir: Path) -> None:
    doc = _state(data_dir, scale=4.0).readings_json()
    per_engine, scales = readings_from_json(doc)
    (name,) = per_engine
    assert scales[name] == 4.0
    assert per_engine[name][0].itl_sum == pytest.approx(429.4102602299998 / 4)


def test_a_document_that_is_not_readings_is_one_line_and_bad_rows_are_dropped() -> None:
    for doc in (None, [], {"format": "x"}, {"format": FORMAT, "engines": "x"}):
        with pytest.raises(ReadingsError):
            readings_from_json(doc)
    good = [1.0, 4, 2.0, 100, 500, 5, 300, 5, 0, 1.0, 4, 120, 500, 105]
    rows = [good, [*good[:-1]], [True, *good[1:]], [float("nan"), *good[1:]],
            [1.0, -4, *good[2:]], [2.0, None, *good[2:]], "x", [1.0, 1e300, *good[2:]]]  # fmt: skip
    doc = {"format": FORMAT, "engines": [{"target": "t\nx", "engine": 1, "readings": rows}, 7]}
    per_engine, scales = readings_from_json(doc)
    assert list(per_engine) == ["t x  engine 0"]
    assert [r.t for r in per_engine["t x  engine 0"]] == [1.0, 2.0]  # a null gauge is kept


def test_an_older_sidecars_readings_are_read_without_the_step_counts() -> None:
    """Format 1 (before the steps, prompt tokens computed and tokens generated) still reads;
    its slices then give the steady-loop figures."""
    row = [1.0, 4, 2.0, 100, 500, 5, 300, 5, 0, 1.0, 4]
    doc = {"format": "kvwatch-readings/1", "engines": [{"readings": [row, [*row, 1, 2, 3]]}]}
    (readings,) = readings_from_json(doc)[0].values()
    assert len(readings) == 1 and readings[0].steps is None and readings[0].itl_count == 100


def test_an_unreachable_or_wrong_sidecar_is_one_line() -> None:
    def wrong(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"format": "kvwatch-state/1"})

    with pytest.raises(CliError, match="not a sidecar's readings"):
        from_sidecar("http://side:9477", 10.0, transport=httpx.MockTransport(wrong))
    with pytest.raises(CliError) as e:
        from_sidecar("http://127.0.0.1:9", 10.0)
    assert e.value.code == 3 and "\n" not in str(e.value)
