"""Render what a dashboard's panels would show, as SVG, from the panels' own query results.

No Grafana runs here, so the docs show each panel's data plotted from the same queries on a
real Prometheus (tests/dashboards/live.py fetches them). Thrashing annotations become shaded spans.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from kvwatch.report.svgplot import Line, Span, bar_chart, line_chart, state_lanes
from kvwatch.sidecar.contract.catalogue import STATES
from tests.dashboards.live import PanelQuery, Series

__all__ = ["legend", "panel_svg", "spans_from", "write_preview"]

_STATE_COLORS = ("#73bf69", "#fade2a", "#ff9830", "#f2495c")


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{name}}` replaced by the label's value (a model given as a
    path shortened to its last part, so the pictures stay readable)."""
    short = {
        k: v.rstrip("/").rsplit("/", 1)[-1] if v.startswith("/") else v for k, v in labels.items()
    }
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: short.get(m.group(1), ""), fmt)
    return " ".join(text.split()) or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def spans_from(series: list[Series], step: float, label: str) -> list[Span]:
    """Contiguous stretches where an annotation query returned points."""
    out: list[Span] = []
    for s in series:
        start = prev = None
        for t, _ in s.points:
            if prev is not None and t - prev > 1.5 * step:
                out.append(Span(start, prev, label))  # type: ignore[arg-type]
                start = None
            start = t if start is None else start
            prev = t
        if start is not None and prev is not None:
            out.append(Span(start, prev, label))
    return out


def panel_svg(
    title: str,
    panel_type: str,
    results: list[tuple[PanelQuery, list[Series]]],
    spans: list[Span],
    window: tuple[float, float] | None = None,
) -> str:
    unit = results[0][0].unit if results else ""
    if panel_type == "state-timeline":
        lanes = [
            (legend(pq.legend, s.labels), [(t, int(v)) for t, v in s.points])
            for pq, series in results
            for s in series
        ]
        return state_lanes(title, lanes, STATES, _STATE_COLORS, x_range=window)
    if panel_type in ("bargauge", "stat"):
        bars = [
            (legend(pq.legend, s.labels), s.points[-1][1])
            for pq, series in results
            for s in series
            if s.points
        ]
        if all(pq.instant for pq, _ in results) and _is_buckets(bars):
            bars = _bucket_counts(bars)
        return bar_chart(title, bars, unit)
    lines = [Line(legend(pq.legend, s.labels), s.points) for pq, series in results for s in series]
    y_range = (0.0, 1.0) if unit == "percentunit" else (None, None)
    return line_chart(title, lines, unit, spans=spans, y_range=y_range, x_range=window)


def _is_buckets(bars: list[tuple[str, float]]) -> bool:
    return bool(bars) and all(_le(label) is not None for label, _ in bars)


def _le(label: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return None


def _bucket_counts(bars: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Cumulative `le` buckets to counts per bucket, as Grafana's heatmap format does."""
    ordered = sorted(bars, key=lambda b: _le(b[0]) or 0.0)
    out, prev = [], 0.0
    for label, v in ordered:
        out.append((f"\u2264 {label}" if label != "+Inf" else "more", max(v - prev, 0.0)))
        prev = v
    return out


def write_preview(
    out: Path,
    doc: dict[str, Any],
    results: dict[str, list[tuple[PanelQuery, list[Series]]]],
    spans: list[Span],
    window: tuple[float, float],
) -> Path:
    """One SVG per panel and an index.md that shows them in dashboard order; every chart
    spans the same time window so they line up."""
    out.mkdir(parents=True, exist_ok=True)
    by_panel: dict[str, list[tuple[PanelQuery, list[Series]]]] = defaultdict(list)
    for title, rows in results.items():
        by_panel[title].extend(rows)
    lines = [f"# {doc['title']}: what the panels showed", ""]
    for i, (title, rows) in enumerate(by_panel.items()):
        name = f"{doc['uid']}-{i:02d}.svg"
        (out / name).write_text(panel_svg(title, rows[0][0].panel_type, rows, spans, window))
        lines += [f"![{title}]({name})", ""]
    index = out / f"{doc['uid']}.md"
    index.write_text("\n".join(lines))
    return index
