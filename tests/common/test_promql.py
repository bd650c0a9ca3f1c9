"""Reading Prometheus answers (kvwatch/common/promql.py): rows keyed by labels, range series
by time, the value at a step, and what a broken or hostile answer leaves out."""

from __future__ import annotations

from typing import Any

from kvwatch.common.promql import series_by, value_at, values_by, values_by_labels

ROWS: list[dict[str, Any]] = [
    {"metric": {"instance": "a:8000", "engine": "0", "model_name": "m"}, "value": [1.0, "0.5"]},
    {"metric": {"instance": "b:8000", "model_name": "m"}, "value": [1.0, "NaN"]},  # no traffic
    {"metric": {"instance": "c:8000"}, "value": [1.0, "x"]},
    {"metric": {"instance": "d:8000"}, "value": "0.3"},
    {"metric": "not a dict", "value": [1.0, "2"]},
    {"value": [1.0, "+Inf"]},
]


def test_instant_rows_by_labels_leave_out_what_is_not_a_number() -> None:
    assert values_by_labels(ROWS, ("instance", "engine")) == {
        ("a:8000", "0"): 0.5,
        ("", ""): 2.0,  # the row without a metric object; +Inf (a quantile past its last
        # bucket, a ratio over 0) is no figure either, as NaN is not
    }
    assert values_by(ROWS[:3], "model_name") == {"m": 0.5}


def test_range_series_by_label_and_the_value_at_a_step() -> None:
    rows: list[dict[str, Any]] = [
        {"metric": {"model_name": "m"}, "values": [[10, "1"], [20, "NaN"], [30, "3"], "junk"]},
        {"metric": {"model_name": "n"}, "values": "junk"},
    ]
    series = series_by(rows, "model_name")
    assert series == {"m": {10.0: 1.0, 30.0: 3.0}, "n": {}}
    m = series["m"]
    assert value_at(m, 30) == 3.0
    assert value_at(m, 25) == 1.0  # the last point before: the step it missed
    assert value_at(m, 5) is None
