"""The SVG charts: well-formed XML, gaps for missing values, escaping, a 'no data' face."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from kvwatch.report.svgplot import (
    Line,
    Mark,
    Span,
    bar_chart,
    format_value,
    line_chart,
    state_lanes,
)


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_line_chart_breaks_at_missing_values_and_escapes() -> None:
    pts = [(0.0, 1.0), (1.0, math.nan), (2.0, 3.0), (3.0, 2.0)]
    svg = line_chart(
        "a <b> & c", [Line("x<y", pts)], spans=[Span(1, 2, "ep")], marks=[Mark(2, "stage")]
    )
    root = _parse(svg)
    path = next(e for e in root.iter() if e.tag.endswith("path"))
    assert path.get("d", "").count("M") == 2  # a new stroke after the gap
    assert "a &lt;b&gt; &amp; c" in svg and "x&lt;y" in svg


def test_empty_chart_says_so() -> None:
    assert "no data" in line_chart("t", [Line("a", [])])


def test_bars_and_lanes_are_valid_svg() -> None:
    _parse(bar_chart("b", [("one", 1.0), ("two", math.nan)]))
    lanes = state_lanes("s", [("e0", [(0.0, 0), (1.0, 3)])], ("ok", "a", "b", "bad"), "abcd")
    assert "<title>bad</title>" in lanes
    _parse(lanes)


def test_format_value() -> None:
    assert format_value(0.93, "percentunit") == "93%"
    assert format_value(0.25, "s") == "250 ms"
    assert format_value(0.00012, "s") == "0.12 ms" and format_value(0.0016, "s") == "1.6 ms"
    assert format_value(1500) == "1.5k"


def test_stage_labels_close_together_take_rows_and_never_overlap() -> None:
    """Stages seconds apart printed their labels over each other on one line."""
    from kvwatch.report.svgplot import _W, _Frame, mark_layout

    f = _Frame(0.0, 100.0, 0.0, 1.0)
    marks = [Mark(x, f"concurrency:n={x:g}#{x:g}") for x in (0, 2, 4, 6, 8, 50, 97)]
    layout = mark_layout(f, marks)
    assert {row for _, row, _ in layout} == {0, 1, 2}
    for i, (x0, row, text) in enumerate(layout):
        assert x0 >= 0 and x0 + 7.0 * len(text) <= _W  # inside the chart
        for x1, row1, text1 in layout[i + 1 :]:
            if row1 == row:
                assert x0 + 7.0 * len(text) <= x1 or x1 + 7.0 * len(text1) <= x0, (text, text1)
    shortened = [t for _, _, t in layout if t.endswith("\u2026")]
    assert shortened  # five labels in 8% of the width cannot all fit whole
    svg = line_chart("t", [Line("a", [(0.0, 0.0), (100.0, 1.0)])], marks=marks)
    assert "<title>concurrency:n=8#8</title>" in svg  # the whole label stays, as a tooltip
    _parse(svg)
