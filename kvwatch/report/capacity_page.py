"""The capacity page: `kvwatch report DIR` on a `kvwatch loadgen search` directory.

SLO attainment and preemptions per second against load, the SLO limit and the KV onset marked,
the table of loads, and the sizing advice at the binding point (from that probe's own run
directory). Self-contained like the run report: inline CSS and SVG, no script.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path

from kvwatch.common.cli_kit import EXIT_USAGE, CliError
from kvwatch.loadgen.results.run_files import read_run
from kvwatch.loadgen.results.search_file import SEARCH_FILE, SearchFile, read_search, render_search
from kvwatch.report.parts import CSS, advice_html, model_html
from kvwatch.report.svgplot import Line, Mark, line_chart

__all__ = ["is_search_dir", "render_capacity"]


def is_search_dir(run_dir: Path) -> bool:
    return (run_dir / SEARCH_FILE).is_file()


def _load(run_dir: Path) -> SearchFile:
    """search.json, read once and checked: it is a file from outside like any other input."""
    path = run_dir / SEARCH_FILE
    try:
        return read_search(run_dir)
    except OSError as e:
        raise CliError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise CliError(f"{path}: {e}", EXIT_USAGE) from None


def render_capacity(run_dir: Path) -> str:
    doc = _load(run_dir)
    by, target = doc.by, doc.attainment_target
    unit = "in flight" if by == "concurrency" else "req/s"
    loads = doc.loads
    limit = "SLO limit" if doc.min_fail is not None else "met SLOs up to the maximum"
    marks = [
        Mark(v.load, label)
        for v, label in ((doc.max_ok, limit), (doc.kv_onset, "KV onset"))
        if v is not None
    ]
    x_range = (min(v.load for v in loads), max(v.load for v in loads)) if loads else None
    attain = line_chart(
        f"Requests meeting every SLO, against load ({unit})",
        [
            Line("met the SLOs", [(v.load, v.attainment) for v in loads]),
            Line("95% interval, low", [(v.load, v.interval95[0]) for v in loads]),
        ],
        "percentunit",
        marks=marks,
        thresholds=[(target, "#d62728")],
        y_range=(0.0, 1.0),
        relative_x=True,
        x_range=x_range,
        x_unit="",
    )
    preempt = line_chart(
        f"Preemptions per second, against load ({unit})",
        [
            Line(
                "preemptions/s",
                [(v.load, v.preemptions_per_s) for v in loads if v.preemptions_per_s is not None],
            )
        ],  # fmt: skip
        marks=marks,
        relative_x=True,
        x_range=x_range,
        x_unit="",
    )
    slo = ", ".join(f"{k} &le; {v * 1000:.0f} ms" for k, v in doc.slo)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc.started_unix or 0))
    binding = doc.binding or (
        "none found: no load up to the maximum failed the SLOs"
        if doc.min_fail is None
        else "none found"
    )
    verdict_class = "good" if doc.max_ok is not None else "bad"
    found = render_search(doc).split("\n\n", 1)[-1].splitlines()
    summary = "".join(f"<p>{escape(line)}</p>" for line in found)
    at = doc.kv_onset or doc.min_fail
    advice_at = at.probes if at is not None else ()
    if not advice_at:
        advice = "<p class='note'>No load failed and none preempted: nothing to size for.</p>"
    elif not (run_dir / "probes" / advice_at[0]).is_dir():
        advice = f"<p class='note'>The probe {escape(advice_at[0])} is not in this directory.</p>"
    else:
        try:
            advice = advice_html(read_run(run_dir / "probes" / advice_at[0]))[0]
        except ValueError as e:
            advice = f"<p class='note'>No advice: {escape(str(e))}</p>"
    rows = []
    for p in doc.probes:
        pre = "-" if p.preemptions is None else f"{p.preemptions:.0f}"
        rows.append(
            f"<tr><td>{escape(p.name)}</td><td class='n'>{p.load:g}</td>"
            f"<td class='n'>{p.requests:g}</td><td class='n'>{p.attained:g}</td>"
            f"<td class='n'>{pre}</td><td class='n'>{p.duration_s:.0f}</td></tr>"
        )
    probes = "".join(rows)
    body = [
        f"<h1>kvwatch capacity: {escape(run_dir.name)}</h1>",
        f"<p class='sub'>{escape(str(doc.target))} &middot; model "
        f"{model_html(doc.model)} &middot; started {started} &middot; "
        f"by {escape(by)}, SLOs {slo}, {target:.0%} of requests</p>",
        f"<div class='verdict {verdict_class}'>{summary}</div>",
        "<h2>Capacity</h2>",
        attain,
        preempt,
        "<p class='note'>Dotted lines: the highest load meeting the SLOs and the KV onset "
        "(the lowest load that preempted). Red dashes: the attainment target.</p>",
        f"<p>Limit that binds first: <b>{escape(binding)}</b>.</p>",
        "<h2>Probes</h2>",
        "<table><tr><th>probe</th><th>load</th><th>requests</th><th>met SLOs</th>"
        f"<th>preemptions</th><th>seconds</th></tr>{probes}</table>",
        "<p class='note'>Each probe's run directory is under <code>probes/</code>: "
        "<code>kvwatch report</code> draws any of them.</p>",
        "<h2>Sizing advice at the binding point</h2>",
        advice,
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>kvwatch capacity: {escape(run_dir.name)}</title><style>{CSS}</style></head>"
        "<body>" + "".join(body) + "</body></html>\n"
    )
