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
from html import escape
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import EXIT_USAGE, CliError, os_error
from kvwatch.loadgen.results.rundir import read_run
from kvwatch.loadgen.results.working_set import render_working_set
from kvwatch.loadgen.workload.trace import render_replay
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
    page = render_capacity(ns.run_dir) if is_search_dir(ns.run_dir) else render_report(ns.run_dir)
    try:
        out.write_text(page)
    except OSError as e:
        raise os_error("write", e) from None
    print(out)
    return 0


# ---- pure helpers (tested on their own) ----


def counter_rate(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """Per-second rate of a counter between samples; a drop (server restart) restarts from
    the new value instead of going negative."""
    out = []
    for a, b in zip(rows, rows[1:], strict=False):
        va, vb = a.get(key), b.get(key)
        dt = b["t"] - a["t"]
        if va is None or vb is None or dt <= 0:
            continue
        out.append((b["t"], counter_increase(va, vb) / dt))
    return out


def state_spans(
    rows: list[dict[str, Any]], state: str = _THRASHING, color: str = "#d62728"
) -> list[Span]:
    """Stretches of the timeline where the sidecar said `state`."""
    out: list[Span] = []
    start = prev = None
    for r in rows:
        if r.get("state") == state:
            start = r["t"] if start is None else start
            prev = r["t"]
        elif start is not None:
            out.append(Span(start, r["t"], state, color))
            start = None
    if start is not None and prev is not None:
        out.append(Span(start, prev, state, color))
    return out


def bucket_delta(before: list[list[float]], after: list[list[float]]) -> list[tuple[str, float]]:
    """Counts per bucket of a cumulative histogram between two snapshots."""
    b = {le: n for le, n in before}
    cum = [(le, n - b.get(le, 0.0)) for le, n in sorted(after)]
    out, prev = [], 0.0
    for le, n in cum:
        label = "more" if math.isinf(le) else f"\u2264 {le:g}"
        out.append((label, max(n - prev, 0.0)))
        prev = n
    return out


# ---- the page ----


def _load(run_dir: Path) -> dict[str, Any]:
    try:
        run = read_run(run_dir)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    return {
        "spec": run.spec,
        "summary": run.summary,
        "records": run.records,
        "events": [e for e in run.events if _has_number(e, "t") and e.get("stage")],
        "timeline": [r for r in run.timeline if _has_number(r, "t")],
        "alerts": run.alerts,
        "dropped": run.dropped,
    }


def _has_number(row: Any, key: str) -> bool:
    """A row from a file someone may have edited: skip what cannot be plotted."""
    return isinstance(row, dict) and isinstance(row.get(key), int | float)


def _table(rows: list[tuple[str, str]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _field(d: Any, key: str) -> Any:
    """`d[key]` where `d` is a mapping (a hand-edited summary.json may hold anything)."""
    return d.get(key) if isinstance(d, dict) else None


def _pcts(d: Any, unit: str = "s") -> str:
    """p50/p90/p99 of a summary's percentiles; whatever is not a finite number (a hand-edited
    summary.json) is left out."""
    if not isinstance(d, dict):
        return "n/a"
    shown = [
        f"{k} {format_value(d[k], unit)}"
        for k in ("p50", "p90", "p99")
        if isinstance(d.get(k), int | float)
        and not isinstance(d.get(k), bool)
        and math.isfinite(d[k])
    ]
    return ", ".join(shown) or "n/a"


def render_report(run_dir: Path) -> str:
    d = _load(run_dir)
    spec, summary, records = d["spec"], d["summary"], d["records"]
    t0 = spec.get("start_unix") or (d["timeline"][0]["t"] if d["timeline"] else 0.0)
    tl = [dict(r, t=r["t"] - t0) for r in d["timeline"]]
    labels = _stage_labels(spec)
    marks = [
        Mark(e["t"], labels.get(e["stage"], e["stage"]))
        for e in d["events"]
        if e.get("event") == "stage_start"
    ]
    spans = state_spans(tl, Level.SATURATED.label, "#ff7f0e") + state_spans(tl)
    ends = [r["t"] for r in tl] + [r["finished_at"] for r in records if r.get("finished_at")]
    window = (0.0, max(ends, default=1.0))
    advice, verdict = advice_html(run_dir)
    skipped = (
        [f"<p class='note'>{d['dropped']} values of the wrong type in the run files (edited by "
         "hand?) were left out of this page.</p>"]
        if d["dropped"] else []
    )  # fmt: skip
    body = [
        *_headline(run_dir, spec, summary, spans, verdict),
        *skipped,
        *_summary_section(_field(summary, "overall") or {}),
        *_workload_section(spec, labels),
        *_over_time_section(tl, spans, marks, window),
        *_requests_section(records, marks, spans, window),
        *_sessions_section(summary.get("sessions")),
        *_groups_section(
            "Priority classes",
            "class",
            summary.get("classes"),
            "Lower runs first under vLLM's <code>--scheduling-policy priority</code>; under "
            "pressure the highest value, latest arrival, is the one preempted.",
        ),
        *_groups_section(
            "Bystander probes",
            "stage",
            _field(summary.get("probes"), "stages"),
            "Small requests at a fixed rate on connections of their own "
            "(<code>--probe-rate</code>): what the load did to everyone else. They are left "
            "out of every other figure on this page.",
        ),
        *_trace_section(summary.get("trace")),
        *_preemptions_section(spec),
        *_incidents_section(summary.get("sidecar")),
        *_alerts_section(d["alerts"]),
        "<h2>Sizing advice</h2>",
        advice,
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>kvwatch report: {escape(run_dir.name)}</title><style>{CSS}</style></head>"
        "<body>" + "".join(body) + "</body></html>\n"
    )


def _headline(
    run_dir: Path,
    spec: dict[str, Any],
    summary: dict[str, Any],
    spans: list[Span],
    verdict: str | None,
) -> list[str]:
    """The title, what ran where, and the verdict in one coloured line."""
    overall = summary.get("overall", {})
    server = summary.get("server") or {}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(spec.get("start_unix") or 0))
    episodes = [sp for sp in spans if sp.label == _THRASHING]
    thrashed = bool(episodes) or bool(server.get("repeat_preempted"))
    return [
        f"<h1>kvwatch run report: {escape(run_dir.name)}</h1>",
        f"<p class='sub'>{escape(str(spec.get('target')))} &middot; model "
        f"{model_html(spec.get('model'))} &middot; started {started} &middot; "
        f"{overall.get('duration_s') or 0:.0f} s</p>",
        f"<div class='verdict {'bad' if thrashed else 'good'}'>"
        + (
            f"<b>Thrashing</b>: {len(episodes)} episode(s) seen by the sidecar; "
            if episodes
            else ("<b>Repeated preemption</b>: " if thrashed else "<b>No thrashing</b>: ")
        )
        + f"{server.get('preemptions', 0) or 0:.0f} preemptions, "
        f"{server.get('repeat_preempted', 0) or 0:.0f} requests preempted more than once."
        + (f"<br>{escape(verdict)}" if verdict else "")
        + "</div>",
    ]


def _summary_section(o: dict[str, Any]) -> list[str]:
    figures = _table(
        [
            (
                "requests",
                f"{_num(o.get('completed')) or 0} completed, {_num(o.get('failed')) or 0} failed",
            ),
            ("output tokens/s", _num(o.get("output_token_throughput")) or "0"),
            ("time to first token", _pcts(o.get("ttft"))),
            ("inter-token latency", _pcts(o.get("itl"))),
            ("end-to-end", _pcts(o.get("e2e"))),
            ("dispatch lag (sent minus scheduled)", _pcts(o.get("dispatch_lag"))),
            ("stalls", _stalls(o)),
            *_server_timing_rows(o.get("server_timings")),
        ]
    )
    return ["<h2>Summary</h2>", figures]


def _server_timing_rows(t: Any) -> list[tuple[str, str]]:
    """vLLM's own timings of the same requests (`--enable-per-request-metrics`)."""
    if not isinstance(t, dict):
        return []
    return [
        ("vLLM's queue time (its own, per request)", _pcts(t.get("queue_time"))),
        ("vLLM's TTFT after the queue", _pcts(t.get("ttft_after_queue"))),
        ("TTFT outside the engine (client minus vLLM's)", _pcts(t.get("client_overhead"))),
    ]


def _groups_section(title: str, key: str, groups: Any, note: str) -> list[str]:
    """A row per class or stage of the summary's own figures (nothing when there are none)."""
    if not isinstance(groups, dict) or not groups:
        return []
    rows = "".join(
        f"<tr><td>{escape(str(name))}</td>"
        f"<td class='n'>{_num(g.get('completed')) or 0}/{_num(g.get('requests')) or 0}</td>"
        f"<td>{_pcts(g.get('ttft'))}</td><td>{_pcts(g.get('itl'))}</td>"
        f"<td>{_pcts(g.get('e2e'))}</td><td>{escape(_stalls(g))}</td></tr>"
        for name, g in groups.items()
        if isinstance(g, dict)
    )
    return [
        f"<h2>{title}</h2>",
        f"<p class='note'>{note}</p>",
        f"<table><tr><th>{key}</th><th>done/sent</th><th>TTFT</th><th>inter-token</th>"
        f"<th>end-to-end</th><th>stalls</th></tr>{rows}</table>",
    ]


def _stage_labels(spec: dict[str, Any]) -> dict[str, str]:
    """Each stage's key (its name in the records) to its load in a user's words; a run written
    before stages carried a label keeps its key."""
    out = {}
    for st in spec.get("stages") or []:
        if isinstance(st, dict) and st.get("name"):
            out[st["name"]] = st.get("label") or st["name"]
    return out


def _workload_rows(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The workload as a table: what the prompts were, in words, not the file's JSON."""
    workload = spec.get("workload")
    w = workload if isinstance(workload, dict) else {}
    shown = [
        ("prompts from", w.get("dataset")),
        ("trace replayed", w.get("trace")),
        ("trace format", w.get("format")),
        ("trace speed", w.get("speed")),
        ("trace lengths x", w.get("length_scale")),
        ("sessions", "conversations" if w.get("sessions") else None),
        ("turns per session", w.get("turns")),
        ("think time (s)", w.get("think_time_s")),
        ("calls per turn", w.get("fanout") if (w.get("fanout") or 1) != 1 else None),
        ("prompt tokens" if not w.get("sessions") else "opening tokens", w.get("input_len")),
        ("new message tokens", w.get("turn_input_len")),
        ("output tokens", w.get("output_len")),
    ]
    if w.get("token_exact") is not None:
        exact = "exact (token ids)" if w["token_exact"] else "approximate (text, re-tokenized)"
        shown.append(("lengths", exact))
    if w.get("shared_prefix"):  # groups only mean something with a shared prefix
        shown += [("shared prefix", f"{w['shared_prefix']} tokens"),
                  ("prefix groups", w.get("prefix_groups"))]  # fmt: skip
    rows = [(label, escape(str(v))) for label, v in shown if v not in (None, "")]
    api = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
    if spec.get("endpoint") in api:
        rows.append(("API", api[spec["endpoint"]]))
    if spec.get("ignore_eos") is not None:
        rows.append(("stops at EOS", "no (ignore_eos)" if spec["ignore_eos"] else "yes"))
    if spec.get("seed") is not None:
        rows.append(("seed", escape(str(spec["seed"]))))
    return rows


def _workload_section(spec: dict[str, Any], labels: dict[str, str]) -> list[str]:
    stages = "".join(
        f"<tr><td>{escape(labels.get(s.get('name') or '', s.get('name') or ''))}</td>"
        f"<td><code class='key'>{escape(s.get('name') or '')}</code></td>"
        f"<td class='n'>{s.get('duration_s') or ''}</td><td class='n'>{s.get('count') or ''}</td>"
        f"<td>{'warm-up' if s.get('warmup') else ''}</td></tr>"
        for s in spec.get("stages", [])
        if isinstance(s, dict)
    )
    rows = _workload_rows(spec)
    return [
        "<h2>Workload</h2>",
        f"<table><tr><th>load</th><th>stage</th><th>seconds</th><th>requests</th><th></th></tr>{stages}</table>",
        _table(rows) if rows else "",
    ]  # fmt: skip


def _over_time_section(
    tl: list[dict[str, Any]], spans: list[Span], marks: list[Mark], window: tuple[float, float]
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
            [Line("KV usage", [(r["t"], _f(r.get("kv_usage"))) for r in tl])],
            "percentunit",
            thresholds=[(th.pressure_kv, "#ff7f0e"), (th.saturated_kv, "#d62728")],
            y_range=(0.0, 1.0),
            **shared,
        ),
        line_chart(
            "Preemptions per second",
            [Line("preemptions/s", counter_rate(tl, "preemptions_total"))],
            thresholds=[(th.thrashing_preemptions_per_s, "#d62728")],
            **shared,
        ),
        line_chart(
            "Running and waiting requests",
            [
                Line("running", [(r["t"], _f(r.get("running"))) for r in tl]),
                Line("waiting", [(r["t"], _f(r.get("waiting"))) for r in tl]),
            ],
            **shared,
        ),
    ]
    if any("state" in r for r in tl):
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


def _sessions_section(s: Any) -> list[str]:
    """Per turn: prompts grow with the conversation; TTFT stays flat while the cache keeps the
    context, and grows with it when the cache evicts it."""
    if not isinstance(s, dict) or not isinstance(s.get("turns"), dict):
        return []
    rows = "".join(
        f"<tr><td class='n'>{escape(str(turn))}</td><td class='n'>{_num(v.get('requests'))}</td>"
        f"<td class='n'>{_num(v.get('prompt_tokens_mean'))}</td>"
        f"<td>{_pcts(v.get('ttft'))}</td></tr>"
        for turn, v in s["turns"].items()
        if isinstance(v, dict)
    )
    cut = _num(s.get("cut"))
    out = [
        "<h2>Sessions</h2>",
        f"<p>{_num(s.get('sessions')) or 0} conversations"
        + (f", {cut} cut short by a failed turn" if cut not in ("", "0") else "") + ".</p>",
        f"<table><tr><th>turn</th><th>requests</th><th>prompt tokens (mean)</th><th>TTFT</th>"
        f"</tr>{rows}</table>",
    ]  # fmt: skip
    ws = s.get("working_set")
    if isinstance(ws, dict):
        try:
            out.append(f"<p>{escape(render_working_set(ws))}.</p>")
        except (KeyError, TypeError, ValueError):
            out.append("<p class='note'>The working set in summary.json is unreadable.</p>")
    return out


def _num(v: Any) -> str:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return f"{v:,.0f}" if ok else ""


def _trace_section(tr: Any) -> list[str]:
    if not isinstance(tr, dict):
        return []
    head = "<h2>Trace replay</h2>"
    try:
        lines = render_replay(tr).splitlines()
    except (KeyError, TypeError, ValueError):
        return [head, "<p class='note'>The replay in summary.json is unreadable.</p>"]
    return [head, *(f"<p>{escape(x.removeprefix('trace: '))}</p>" for x in lines)]


def _preemptions_section(spec: dict[str, Any]) -> list[str]:
    buckets = _preemption_buckets(spec)
    if not buckets:
        return [
            "<h2>Preemptions per finished request</h2>",
            "<p class='note'>The server exported no per-request preemption histogram.</p>",
        ]
    return [
        "<h2>Preemptions per finished request</h2>",
        bar_chart("Requests by how often vLLM preempted them", buckets),
    ]


def _alerts_section(alerts: list[Any]) -> list[str]:
    """What the webhook receiver got, one row per delivery (alerts.jsonl keeps the payloads)."""
    rows = [a for a in alerts if isinstance(a, dict)]
    if not rows:
        return []
    out = ["<h2>Alerts delivered</h2>",
           "<table><tr><th>at</th><th>status</th><th>alert</th><th>summary</th></tr>"]  # fmt: skip
    for a in rows:
        annotations = a.get("annotations")
        summary = annotations.get("summary") if isinstance(annotations, dict) else None
        at = str(a.get("starts_at") or "")[:19].replace("T", " ")
        status = str(a.get("status") or "") + (" (repeat)" if a.get("repeat") is True else "")
        cells = (at, status, a.get("alertname"), summary)
        out.append("<tr>" + "".join(f"<td>{escape(str(c or ''))}</td>" for c in cells) + "</tr>")
    out.append("</table><p class='note'>The payloads as sent: alerts.jsonl.</p>")
    return out


def _incidents_section(side: Any) -> list[str]:
    """What the sidecar's followed log told of, and its engines' status at the run's end."""
    out = ["<h2>Incidents</h2>"]
    if not isinstance(side, dict) or not side:
        return [*out, "<p class='note'>No sidecar was given to this run (--sidecar).</p>"]
    engines = side.get("engines")
    rows = [
        (f"engine of {t} at the end", escape(
            f"{e.get('status', '?')}" + (f": {e['reason']}" if e.get("reason") else "")
        ))
        for t, e in (engines.items() if isinstance(engines, dict) else ())
        if isinstance(e, dict)
    ]  # fmt: skip
    if rows:
        out.append(_table(rows))
    incidents = [i for i in side.get("incidents") or [] if isinstance(i, dict)]
    if not incidents:
        out.append(
            "<p class='note'>The sidecar's log told of no incident (or it follows no log: "
            "--log).</p>"
        )
        return out
    out.append("<table><tr><th>at</th><th>what</th><th>detail</th><th>cause</th></tr>")
    for i in incidents:
        cells = (i.get("at"), i.get("what"), i.get("detail"), i.get("cause"))
        out.append("<tr>" + "".join(f"<td>{escape(str(c or ''))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return out


def _f(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _requests_section(
    records: list[dict[str, Any]], marks: list[Mark], spans: list[Span], window: tuple[float, float]
) -> list[str]:
    done = [r for r in records if r.get("ok") and r.get("finished_at") is not None]
    ok = [r for r in done if not r.get("probe")]
    probes = [r for r in done if r.get("probe")]
    if not ok:
        return ["<h2>Requests</h2><p class='note'>No request completed.</p>"]
    probe_line = [Line("probe TTFT", [(r["finished_at"], _f(r.get("ttft"))) for r in probes])]
    by_stalls: dict[str, float] = {}
    for r in ok:
        k = str(min(r.get("stalls") or 0, 4)) + ("+" if (r.get("stalls") or 0) >= 4 else "")
        by_stalls[k] = by_stalls.get(k, 0) + 1
    order = sorted(by_stalls, key=lambda k: int(k.rstrip("+")))
    return [
        "<h2>Requests</h2>",
        line_chart(
            "Each request's latency, at the time it finished",
            [
                Line("TTFT", [(r["finished_at"], _f(r.get("ttft"))) for r in ok]),
                Line("end-to-end", [(r["finished_at"], _f(r.get("e2e"))) for r in ok]),
                Line("largest gap", [(r["finished_at"], _f(r.get("max_gap"))) for r in ok]),
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


def _stalls(o: dict[str, Any]) -> str:
    text = f"{o.get('stalls', 0)} in {o.get('requests_with_stalls', 0)} requests"
    preempting = o.get("stalls_preempting")
    if preempting is not None and o.get("stalls"):
        text += f"; {preempting} while the server preempted, {o['stalls'] - preempting} without"
    return text


def _preemption_buckets(spec: dict[str, Any]) -> list[tuple[str, float]]:
    def pairs(snapshot: str) -> list[list[float]]:
        rows = (spec.get(snapshot) or {}).get("preemption_buckets") or []
        return [r for r in rows if len(r) == 2 and None not in r]

    after = pairs("server_after")
    return bucket_delta(pairs("server_before"), after) if after else []
