"""Panel previews: legends as Grafana writes them, histogram buckets as counts, spans."""

from __future__ import annotations

from tests.dashboards.live import Series
from tests.dashboards.preview import _bucket_counts, legend, spans_from


def test_legend_format() -> None:
    labels = {"instance": "h:1", "model_name": "/m/tiny-v1/", "engine": "0"}
    assert legend("{{instance}} {{model_name}} e{{ engine }}", labels) == "h:1 tiny-v1 e0"
    assert legend("", {"a": "1"}) == "a=1"


def test_cumulative_buckets_become_counts() -> None:
    got = _bucket_counts([("2.0", 7.0), ("+Inf", 8.0), ("1.0", 5.0)])
    assert got == [("\u2264 1.0", 5.0), ("\u2264 2.0", 2.0), ("more", 1.0)]


def test_spans_split_at_gaps() -> None:
    s = Series({}, [(0.0, 1.0), (1.0, 1.0), (5.0, 1.0), (6.0, 1.0)])
    assert [(x.start, x.end) for x in spans_from([s], 1.0, "t")] == [(0.0, 1.0), (5.0, 6.0)]
