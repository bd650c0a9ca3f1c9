"""`kvwatch report RUN_DIR`: one self-contained HTML page about a run.

The page must open offline, from a file, mailed or attached to a ticket: inline CSS and inline
SVG (kvwatch/report/svgplot.py), no script, no fonts or images from anywhere. It reads only the run
directory (spec, records, events, timeline, summary, and the sidecar's alerts when the demo
wrote them) and computes the advice again with its arithmetic.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from html import escape
from typing import Any

from kvwatch.common.cli_kit import EXIT_USAGE, CliError, os_error
from kvwatch.loadgen.results.run_files import (
    Figures,
    Percentiles,
    Record,
    RunFiles,
    RunSpec,
    SessionsSummary,
    SidecarSummary,
    TimelineRow,
    read_run,
)
from kvwatch.report.parts import CSS, advice_html, model_html
from kvwatch.report.svgplot import Line, Mark, Span, bar_chart, format_value, line_chart
from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS
from kvwatch.sidecar.judge.timeline import counter_increase

__all__ = ["run_report", "render_report", "counter_rate", "state_spans", "bucket_delta"]

_THRASHING = Level.THRASHING.label  # the state names the timeline rows carry


def run_report(ns: argparse.Namespace) -> int:
    from kvwatch.report.capacity_page import is_search_dir, render_capacity

    out = ns.out or ns.run_dir / "report.html"
    if is_search_dir(ns.run_dir):
        page = render_capacity(ns.run_dir)
    else:
        try:
            run = read_run(ns.run_dir)
        except ValueError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        page = render_report(run)
    try:
        out.write_text(page)
    except OSError as e:
        raise os_error("write", e) from None
    print(out)
    return 0


# ---- pure helpers (tested on their own) ----


def counter_rate(points: list[tuple[float, float | None]]) -> list[tuple[float, float]]:
    """Per-second rate of a counter between samples (time, value); a drop (server restart)
    restarts from the new value instead of going negative."""
    out = []
    for (ta, va), (tb, vb) in zip(points, points[1:], strict=False):
        if va is None or vb is None or tb - ta <= 0:
            continue
        out.append((tb, counter_increase(va, vb) / (tb - ta)))
    return out


def state_spans(
    rows: list[tuple[float, str | None]], state: str = _THRASHING, color: str = "#d62728"
) -> list[Span]:
    """Stretches of the timeline (time, the sidecar's state) where the sidecar said `state`."""
    out: list[Span] = []
    start = prev = None
    for t, said in rows:
        if said == state:
            start = t if start is None else start
            prev = t
        elif start is not None:
            out.append(Span(start, t, state, color))
            start = None
    if start is not None and prev is not None:
        out.append(Span(start, prev, state, color))
    return out


def bucket_delta(
    before: tuple[tuple[float, float], ...], after: tuple[tuple[float, float], ...]
) -> list[tuple[str, float]]:
    """Counts per bucket of a cumulative histogram between two snapshots."""
    b = dict(before)
    cum = [(le, n - b.get(le, 0.0)) for le, n in sorted(after)]
    out, prev = [], 0.0
    for le, n in cum:
        label = "more" if math.isinf(le) else f"\u2264 {le:g}"
        out.append((label, max(n - prev, 0.0)))
        prev = n
    return out


# ---- the page ----


def _table(rows: list[tuple[str, str]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _pcts(d: Percentiles | None, unit: str = "s") -> str:
    """p50/p90/p99; what the run files did not hold is left out."""
    if d is None:
        return "n/a"
    shown = [
        f"{k} {format_value(v, unit)}"
        for k, v in (("p50", d.p50), ("p90", d.p90), ("p99", d.p99))
        if v is not None and math.isfinite(v)
    ]
    return ", ".join(shown) or "n/a"


def render_report(run: RunFiles) -> str:
    spec, summary, records = run.spec, run.summary, run.records
    t0 = spec.start_unix or (run.timeline[0].t if run.timeline else 0.0)
    tl = [replace(r, t=r.t - t0) for r in run.timeline]
    labels = {st.name: st.label for st in spec.stages}
    marks = [
        Mark(e.t, labels.get(e.stage, e.stage)) for e in run.events if e.event == "stage_start"
    ]
    states = [(r.t, r.state) for r in tl]
    spans = state_spans(states, Level.SATURATED.label, "#ff7f0e") + state_spans(states)
    ends = [r.t for r in tl] + [r.finished_at for r in records if r.finished_at]
    window = (0.0, max(ends, default=1.0))
    advice, verdict = advice_html(run)
    skipped = (
        [f"<p class='note'>{run.dropped} values of the wrong type in the run files (edited by "
         "hand?) were left out of this page.</p>"]
        if run.dropped else []
    )  # fmt: skip
    name = run.directory.name
    body = [
        *_headline(name, run, spans, verdict),
        *skipped,
        *_summary_section(summary.overall),
        *_workload_section(spec),
        *_over_time_section(tl, spans, marks, window),
        *_requests_section(records, marks, spans, window),
        *_sessions_section(summary.sessions),
        *_groups_section(
            "Priority classes",
            "class",
            summary.classes,
            "Lower runs first under vLLM's <code>--scheduling-policy priority</code>; under "
            "pressure the highest value, latest arrival, is the one preempted.",
        ),
        *_groups_section(
            "Bystander probes",
            "stage",
            summary.probe_stages,
            "Small requests at a fixed rate on connections of their own "
            "(<code>--probe-rate</code>): what the load did to everyone else. They are left "
            "out of every other figure on this page.",
        ),
        *_trace_section(summary.trace, summary.trace_unreadable),
        *_preemptions_section(spec),
        *_incidents_section(summary.sidecar),
        *_alerts_section(run),
        "<h2>Sizing advice</h2>",
        advice,
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>kvwatch report: {escape(name)}</title><style>{CSS}</style></head>"
        "<body>" + "".join(body) + "</body></html>\n"
    )


def _headline(name: str, run: RunFiles, spans: list[Span], verdict: str | None) -> list[str]:
    """The title, what ran where, and the verdict in one coloured line."""
    spec, server = run.spec, run.summary.server
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(spec.start_unix or 0))
    episodes = [sp for sp in spans if sp.label == _THRASHING]
    thrashed = bool(episodes) or bool(server.repeat_preempted)
    return [
        f"<h1>kvwatch run report: {escape(name)}</h1>",
        f"<p class='sub'>{escape(str(spec.target))} &middot; model "
        f"{model_html(spec.model)} &middot; started {started} &middot; "
        f"{run.summary.overall.duration_s or 0:.0f} s</p>",
        f"<div class='verdict {'bad' if thrashed else 'good'}'>"
        + (
            f"<b>Thrashing</b>: {len(episodes)} episode(s) seen by the sidecar; "
            if episodes
            else ("<b>Repeated preemption</b>: " if thrashed else "<b>No thrashing</b>: ")
        )
        + f"{server.preemptions or 0:.0f} preemptions, "
        f"{server.repeat_preempted or 0:.0f} requests preempted more than once."
        + (f"<br>{escape(verdict)}" if verdict else "")
        + "</div>",
    ]


def _summary_section(o: Figures) -> list[str]:
    figures = _table(
        [
            ("requests", f"{_num(o.completed) or 0} completed, {_num(o.failed) or 0} failed"),
            ("output tokens/s", _num(o.output_token_throughput) or "0"),
            ("time to first token", _pcts(o.ttft)),
            ("inter-token latency", _pcts(o.itl)),
            ("end-to-end", _pcts(o.e2e)),
            ("dispatch lag (sent minus scheduled)", _pcts(o.dispatch_lag)),
            ("stalls", _stalls(o)),
            *_server_timing_rows(o),
        ]
    )
    return ["<h2>Summary</h2>", figures]


def _server_timing_rows(o: Figures) -> list[tuple[str, str]]:
    """vLLM's own timings of the same requests (`--enable-per-request-metrics`)."""
    t = o.server_timings
    if t is None:
        return []
    return [
        ("vLLM's queue time (its own, per request)", _pcts(t.queue_time)),
        ("vLLM's TTFT after the queue", _pcts(t.ttft_after_queue)),
        ("TTFT outside the engine (client minus vLLM's)", _pcts(t.client_overhead)),
    ]


def _groups_section(
    title: str, key: str, groups: tuple[tuple[str, Figures], ...], note: str
) -> list[str]:
    """A row per class or stage of the summary's own figures (nothing when there are none)."""
    if not groups:
        return []
    rows = "".join(
        f"<tr><td>{escape(name)}</td>"
        f"<td class='n'>{_num(g.completed) or 0}/{_num(g.requests) or 0}</td>"
        f"<td>{_pcts(g.ttft)}</td><td>{_pcts(g.itl)}</td>"
        f"<td>{_pcts(g.e2e)}</td><td>{escape(_stalls(g))}</td></tr>"
        for name, g in groups
    )
    return [
        f"<h2>{title}</h2>",
        f"<p class='note'>{note}</p>",
        f"<table><tr><th>{key}</th><th>done/sent</th><th>TTFT</th><th>inter-token</th>"
        f"<th>end-to-end</th><th>stalls</th></tr>{rows}</table>",
    ]


def _workload_section(spec: RunSpec) -> list[str]:
    stages = "".join(
        f"<tr><td>{escape(s.label)}</td>"
        f"<td><code class='key'>{escape(s.name)}</code></td>"
        f"<td class='n'>{_plain(s.duration_s)}</td><td class='n'>{_plain(s.count)}</td>"
        f"<td>{'warm-up' if s.warmup else ''}</td></tr>"
        for s in spec.stages
    )
    rows = [(label, escape(text)) for label, text in spec.workload_rows]
    return [
        "<h2>Workload</h2>",
        f"<table><tr><th>load</th><th>stage</th><th>seconds</th><th>requests</th><th></th></tr>{stages}</table>",
        _table(rows) if rows else "",
    ]  # fmt: skip


def _plain(v: float | None) -> str:
    """A figure as the run wrote it (30, not 30.0); empty when absent or zero."""
    if not v:
        return ""
    return f"{v:g}" if v != int(v) else str(int(v))


def _over_time_section(
    tl: list[TimelineRow], spans: list[Span], marks: list[Mark], window: tuple[float, float]
) -> list[str]:
    """KV usage, preemptions and the queues over the run, with the sidecar's judgement shaded."""
    body = ["<h2>Over time</h2>"]
    if not tl:
        return [*body, "<p class='note'>No server timeline in this run directory.</p>"]
    th = DEFAULT_THRESHOLDS
    shared: dict[str, Any] = {"spans": spans, "marks": marks, "relative_x": True, "x_range": window}
    body += [
        line_chart(
            "KV cache usage",
            [Line("KV usage", [(r.t, _f(r.kv_usage)) for r in tl])],
            "percentunit",
            thresholds=[(th.pressure_kv, "#ff7f0e"), (th.saturated_kv, "#d62728")],
            y_range=(0.0, 1.0),
            **shared,
        ),
        line_chart(
            "Preemptions per second",
            [Line("preemptions/s", counter_rate([(r.t, r.preemptions_total) for r in tl]))],
            thresholds=[(th.thrashing_preemptions_per_s, "#d62728")],
            **shared,
        ),
        line_chart(
            "Running and waiting requests",
            [
                Line("running", [(r.t, _f(r.running)) for r in tl]),
                Line("waiting", [(r.t, _f(r.waiting)) for r in tl]),
            ],
            **shared,
        ),
    ]
    if any(r.state is not None for r in tl):
        body.append(
            "<p class='note'>Shaded: where the sidecar judged the server saturated "
            "(orange) or thrashing (red). Dotted lines: load stages.</p>"
        )
    else:
        body.append(
            "<p class='note'>Run with <code>--sidecar URL</code> to shade the sidecar's "
            "judgement (saturated, thrashing).</p>"
        )
    return body


def _sessions_section(s: SessionsSummary | None) -> list[str]:
    """Per turn: prompts grow with the conversation; TTFT stays flat while the cache keeps the
    context, and grows with it when the cache evicts it."""
    if s is None:
        return []
    rows = "".join(
        f"<tr><td class='n'>{escape(v.turn)}</td><td class='n'>{_num(v.requests)}</td>"
        f"<td class='n'>{_num(v.prompt_tokens_mean)}</td>"
        f"<td>{_pcts(v.ttft)}</td></tr>"
        for v in s.turns
    )
    cut = _num(s.cut)
    out = [
        "<h2>Sessions</h2>",
        f"<p>{_num(s.sessions) or 0} conversations"
        + (f", {cut} cut short by a failed turn" if cut not in ("", "0") else "") + ".</p>",
        f"<table><tr><th>turn</th><th>requests</th><th>prompt tokens (mean)</th><th>TTFT</th>"
        f"</tr>{rows}</table>",
    ]  # fmt: skip
    if s.working_set is not None:
        out.append(f"<p>{escape(s.working_set)}.</p>")
    elif s.working_set_unreadable:
        out.append("<p class='note'>The working set in summary.json is unreadable.</p>")
    return out


def _num(v: float | None) -> str:
    ok = v is not None and math.isfinite(v)
    return f"{v:,.0f}" if ok else ""


def _trace_section(lines: tuple[str, ...] | None, unreadable: bool) -> list[str]:
    head = "<h2>Trace replay</h2>"
    if unreadable:
        return [head, "<p class='note'>The replay in summary.json is unreadable.</p>"]
    if lines is None:
        return []
    return [head, *(f"<p>{escape(x.removeprefix('trace: '))}</p>" for x in lines)]


def _preemptions_section(spec: RunSpec) -> list[str]:
    after = spec.server_after.preemption_buckets
    buckets = bucket_delta(spec.server_before.preemption_buckets, after) if after else []
    if not buckets:
        return [
            "<h2>Preemptions per finished request</h2>",
            "<p class='note'>The server exported no per-request preemption histogram.</p>",
        ]
    return [
        "<h2>Preemptions per finished request</h2>",
        bar_chart("Requests by how often vLLM preempted them", buckets),
    ]


def _alerts_section(run: RunFiles) -> list[str]:
    """What the webhook receiver got, one row per delivery (alerts.jsonl keeps the payloads)."""
    if not run.alerts:
        return []
    out = ["<h2>Alerts delivered</h2>",
           "<table><tr><th>at</th><th>status</th><th>alert</th><th>summary</th></tr>"]  # fmt: skip
    for a in run.alerts:
        cells = (a.starts_at, a.status + (" (repeat)" if a.repeat else ""), a.alertname, a.summary)
        out.append("<tr>" + "".join(f"<td>{escape(str(c or ''))}</td>" for c in cells) + "</tr>")
    out.append("</table><p class='note'>The payloads as sent: alerts.jsonl.</p>")
    return out


def _incidents_section(side: SidecarSummary | None) -> list[str]:
    """What the sidecar's followed log told of, and its engines' status at the run's end."""
    out = ["<h2>Incidents</h2>"]
    if side is None:
        return [*out, "<p class='note'>No sidecar was given to this run (--sidecar).</p>"]
    rows = [
        (f"engine of {e.target} at the end",
         escape(f"{e.status or '?'}" + (f": {e.reason}" if e.reason else "")))
        for e in side.engines
    ]  # fmt: skip
    if rows:
        out.append(_table(rows))
    if not side.incidents:
        out.append(
            "<p class='note'>The sidecar's log told of no incident (or it follows no log: "
            "--log).</p>"
        )
        return out
    out.append("<table><tr><th>at</th><th>what</th><th>detail</th><th>cause</th></tr>")
    for i in side.incidents:
        cells = (i.at, i.what, i.detail, i.cause)
        out.append("<tr>" + "".join(f"<td>{escape(str(c or ''))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return out


def _f(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _requests_section(
    records: tuple[Record, ...], marks: list[Mark], spans: list[Span], window: tuple[float, float]
) -> list[str]:
    done = [r for r in records if r.ok and r.finished_at is not None]
    ok = [r for r in done if not r.probe]
    probes = [r for r in done if r.probe]
    if not ok:
        return ["<h2>Requests</h2><p class='note'>No request completed.</p>"]
    probe_line = [Line("probe TTFT", [(_f(r.finished_at), _f(r.ttft)) for r in probes])]
    by_stalls: dict[str, float] = {}
    for r in ok:
        n = int(r.stalls or 0)
        k = str(min(n, 4)) + ("+" if n >= 4 else "")
        by_stalls[k] = by_stalls.get(k, 0) + 1
    order = sorted(by_stalls, key=lambda k: int(k.rstrip("+")))
    return [
        "<h2>Requests</h2>",
        line_chart(
            "Each request's latency, at the time it finished",
            [
                Line("TTFT", [(_f(r.finished_at), _f(r.ttft)) for r in ok]),
                Line("end-to-end", [(_f(r.finished_at), _f(r.e2e)) for r in ok]),
                Line("largest gap", [(_f(r.finished_at), _f(r.max_gap)) for r in ok]),
                *(probe_line if probes else []),
            ],
            "s",
            spans=spans,
            marks=marks,
            relative_x=True,
            x_range=window,
            dots=True,
        ),
        bar_chart(
            "Requests by stalls seen (gaps far above the stream's norm)",
            [(f"{k} stalls", by_stalls[k]) for k in order],
        ),
    ]


def _stalls(o: Figures) -> str:
    text = f"{_count(o.stalls)} in {_count(o.requests_with_stalls)} requests"
    if o.stalls_preempting is not None and o.stalls:
        without = o.stalls - o.stalls_preempting
        text += (
            f"; {_count(o.stalls_preempting)} while the server preempted, {_count(without)} without"
        )
    causes = [(n, c, sec) for c, n, sec in o.stall_causes if n]
    if causes and o.stalls:
        by = ", ".join(f"{c} {_count(n)} ({sec:.1f} s)" for n, c, sec in sorted(causes)[::-1])
        text += f"; by cause: {by}"
    return text


def _count(v: float | None) -> str:
    """A count as the summary wrote it (0 when absent)."""
    if v is None:
        return "0"
    return str(int(v)) if v == int(v) else f"{v:g}"
