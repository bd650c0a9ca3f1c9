"""Small, dependency-free SVG charts for the run report and the dashboard previews.

Pictures must open offline and in a test browser with no network, so they are inline SVG
written here rather than a plotting library or a CDN script. Three kinds cover what kvwatch
shows: lines over time (with shaded spans and marks), horizontal bars, and state lanes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

__all__ = [
    "Line", "Span", "Mark", "line_chart", "bar_chart", "state_lanes", "format_value", "mark_layout",
]  # fmt: skip

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_W, _H = 720, 240
_L, _R, _T, _B = 64, 16, 28, 40  # margins: left, right, top, bottom


@dataclass(frozen=True)
class Line:
    label: str
    points: Sequence[tuple[float, float]]  # (x, y); x is seconds (unix or relative)


@dataclass(frozen=True)
class Span:
    """A shaded x range, e.g. a thrashing episode."""

    start: float
    end: float
    label: str
    color: str = "#d62728"


@dataclass(frozen=True)
class Mark:
    """A vertical line at x, e.g. where a load stage began."""

    x: float
    label: str


@dataclass
class _Frame:
    x0: float
    x1: float
    y0: float
    y1: float
    w: int = _W
    h: int = _H
    parts: list[str] = field(default_factory=list)

    def px(self, x: float) -> float:
        return _L + (x - self.x0) / ((self.x1 - self.x0) or 1.0) * (self.w - _L - _R)

    def py(self, y: float) -> float:
        return self.h - _B - (y - self.y0) / ((self.y1 - self.y0) or 1.0) * (self.h - _T - _B)


def format_value(v: float, unit: str = "") -> str:
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit == "s":
        if 0 < abs(v) < 0.01:  # a dispatch lag of a tenth of a millisecond is not "0 ms"
            return f"{v * 1000:.2g} ms"
        return f"{v * 1000:.0f} ms" if 0 < abs(v) < 1 else f"{v:.3g} s"
    if abs(v) >= 1000:
        return f"{v / 1000:.3g}k"
    return f"{v:.3g}"


def _nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _svg(f: _Frame, title: str, body: list[str], legend: list[tuple[str, str]]) -> str:
    items = "".join(
        f'<tspan fill="{c}">\u25a0</tspan><tspan dx="3" dy="0">{escape(label)}</tspan>'
        f'<tspan dx="12"></tspan>'
        for label, c in legend[:8]
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {f.w} {f.h}" role="img" '
        f'class="kvw-chart" font-family="sans-serif" font-size="11">'
        f"<title>{escape(title)}</title>"
        f'<rect width="{f.w}" height="{f.h}" fill="#fff"/>'
        f'<text x="{_L}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(body)
        + f'<text x="{_L}" y="{f.h - 6}">{items}</text></svg>'
    )


def _axes(f: _Frame, unit: str, relative_x: bool, x_unit: str = "s") -> list[str]:
    out = []
    for y in _nice_ticks(f.y0, f.y1):
        py = f.py(y)
        out.append(f'<line x1="{_L}" x2="{f.w - _R}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eee"/>')
        out.append(
            f'<text x="{_L - 6}" y="{py + 4:.1f}" text-anchor="end">{format_value(y, unit)}</text>'
        )
    for x in _nice_ticks(f.x0, f.x1, 6):
        px = f.px(x)
        if x_unit != "s":  # not time: the value as it is (a load, say)
            label = f"{x:g}{x_unit}"
        else:
            label = f"{x - f.x0:.0f}s" if not relative_x else f"{x:.0f}s"
        out.append(f'<text x="{px:.1f}" y="{f.h - _B + 14}" text-anchor="middle">{label}</text>')
    out.append(f'<line x1="{_L}" x2="{f.w - _R}" y1="{f.h - _B}" y2="{f.h - _B}" stroke="#999"/>')
    return out


_CHAR_W = 7.0  # an 11 px sans-serif character with its halo, generously: labels must not touch
_MARK_ROW_H = 19  # a text box with its halo, as Chromium draws it at 11 px
_MARK_ROWS = 3


def _text_w(text: str) -> float:
    return _CHAR_W * len(text)


def mark_layout(f: _Frame, marks: Sequence[Mark]) -> list[tuple[float, int, str]]:
    """Where each mark's label goes: (left x, row, text). A label starts at its line (ends at it
    near the frame's right edge), in the first of three rows where it overlaps no label placed
    before it; where no row has room, the row whose last label ends first takes it and that
    earlier label is shortened to end before it (the whole label stays in its tooltip). Stages
    seconds apart never print over each other, and no label leaves its line."""
    right_edge = f.w - _R
    last: list[int | None] = [None] * _MARK_ROWS  # each row's last label, by index into out
    out: list[tuple[float, int, str]] = []

    def end(i: int | None) -> float:
        return -math.inf if i is None else out[i][0] + _text_w(out[i][2])

    for m in marks:
        px = f.px(m.x)
        w = _text_w(m.label)
        x0 = max(px - 3 - w if px + 3 + w > right_edge else px + 3, float(_L))
        row = next((r for r in range(_MARK_ROWS) if end(last[r]) + 6 <= x0), None)
        if row is None:
            row = min(range(_MARK_ROWS), key=lambda r: end(last[r]))
            i = last[row]
            assert i is not None
            px0, _, text = out[i]
            room = int((x0 - 6 - px0) // _CHAR_W)
            out[i] = (px0, row, text[: room - 1] + "\u2026" if room >= 2 else "")
        last[row] = len(out)
        out.append((x0, row, m.label))
    return out


def line_chart(
    title: str,
    lines: Sequence[Line],
    unit: str = "",
    spans: Sequence[Span] = (),
    marks: Sequence[Mark] = (),
    thresholds: Sequence[tuple[float, str]] = (),
    y_range: tuple[float | None, float | None] = (None, None),
    relative_x: bool = False,
    x_range: tuple[float, float] | None = None,
    dots: bool = False,
    x_unit: str = "s",
) -> str:
    """Lines over time, or dots (one per point, e.g. per request). x values are seconds;
    with relative_x they are printed as they are, otherwise as seconds since the first. Any
    other `x_unit` (e.g. "" for a load) prints x as it is, with that unit."""
    pts = [(x, y) for ln in lines for x, y in ln.points if math.isfinite(y)]
    xs = [x for x, _ in pts] + [s.start for s in spans] + [s.end for s in spans]
    ys = [y for _, y in pts] + [v for v, _ in thresholds]
    if not pts:
        f = _Frame(0, 1, 0, 1)
        msg = f'<text x="{f.w / 2}" y="{f.h / 2}" text-anchor="middle">no data</text>'
        return _svg(f, title, [msg], [])
    y0 = y_range[0] if y_range[0] is not None else min(0.0, min(ys))
    y1 = y_range[1] if y_range[1] is not None else max(ys) * 1.05 or 1.0
    f = _Frame(*(x_range or (min(xs), max(xs))), y0, y1)
    body = _axes(f, unit, relative_x, x_unit)
    for s in spans:
        a, b = f.px(s.start), f.px(max(s.end, s.start))
        body.append(
            f'<rect x="{a:.1f}" y="{_T}" width="{max(b - a, 1):.1f}" height="{f.h - _T - _B}" '
            f'fill="{s.color}" opacity="0.12"><title>{escape(s.label)}</title></rect>'
        )
    for v, color in thresholds:
        py = f.py(v)
        body.append(
            f'<line x1="{_L}" x2="{f.w - _R}" y1="{py:.1f}" y2="{py:.1f}" stroke="{color}" '
            'stroke-dasharray="4 3"/>'
        )
    for m, (x0, row, text) in zip(marks, mark_layout(f, marks), strict=True):
        px = f.px(m.x)
        body.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_T}" y2="{f.h - _B}" stroke="#555" '
            f'stroke-dasharray="2 3"/><text class="kvw-mark" x="{x0:.1f}" '
            f'y="{_T + 10 + row * _MARK_ROW_H}" fill="#555" stroke="#fff" stroke-width="3" '
            f'paint-order="stroke"><title>{escape(m.label)}</title>'
            f"{escape(text)}</text>"
        )
    legend = []
    for i, ln in enumerate(lines):
        color = PALETTE[i % len(PALETTE)]
        legend.append((ln.label, color))
        if dots:
            body += [
                f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.5" fill="{color}"/>'
                for x, y in ln.points
                if math.isfinite(y)
            ]
            continue
        d = []
        pen = "M"
        for x, y in ln.points:
            if not math.isfinite(y):
                pen = "M"
                continue
            d.append(f"{pen}{f.px(x):.1f},{f.py(y):.1f}")
            pen = "L"
        body.append(
            f'<path d="{" ".join(d)}" fill="none" stroke="{color}" stroke-width="1.5">'
            f"<title>{escape(ln.label)}</title></path>"
        )
    return _svg(f, title, body, legend)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], unit: str = "") -> str:
    """Horizontal bars, one per (label, value), in the order given."""
    h = max(_H // 2, _T + 22 * len(bars) + 16)
    top = max([v for _, v in bars if math.isfinite(v)] or [1.0]) or 1.0
    f = _Frame(0, top, 0, 1, h=h)
    body = []
    label_w = 220
    for i, (label, v) in enumerate(bars):
        y = _T + 6 + 22 * i
        width = 0.0 if not math.isfinite(v) else v / top * (f.w - label_w - 80)
        body.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{max(width, 1):.1f}" height="16" '
            f'fill="{PALETTE[0]}"/><text x="{label_w + width + 6:.1f}" y="{y + 13}">'
            f"{format_value(v, unit)}</text>"
        )
    return _svg(f, title, body, [])


def state_lanes(
    title: str,
    lanes: Sequence[tuple[str, Sequence[tuple[float, int]]]],
    names: Sequence[str],
    colors: Sequence[str],
    x_range: tuple[float, float] | None = None,
) -> str:
    """One lane per (label, [(x, level)]), each stretch coloured by its level, like Grafana's
    state timeline."""
    xs = [x for _, pts in lanes for x, _ in pts]
    h = max(_H // 2, _T + 14 + 34 * len(lanes) + _B)
    f = _Frame(*(x_range or (min(xs, default=0.0), max(xs, default=1.0))), 0, 1, h=h)
    body = []
    for i, (label, pts) in enumerate(lanes):
        y = _T + 14 + 34 * i
        body.append(f'<text x="{_L}" y="{y - 2}" font-size="10">{escape(label)}</text>')
        for (x, level), nxt in zip(pts, [*pts[1:], None], strict=True):
            end = nxt[0] if nxt else x
            a, b = f.px(x), f.px(end)
            body.append(
                f'<rect x="{a:.1f}" y="{y}" width="{max(b - a, 1):.1f}" height="20" '
                f'fill="{colors[level % len(colors)]}"><title>{escape(names[level])}</title></rect>'
            )
    for x in _nice_ticks(f.x0, f.x1, 6):
        body.append(
            f'<text x="{f.px(x):.1f}" y="{h - _B + 14}" text-anchor="middle">{x - f.x0:.0f}s</text>'
        )
    return _svg(f, title, body, list(zip(names, colors, strict=True)))
