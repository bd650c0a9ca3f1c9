"""The capacity page: `kvwatch report DIR` on a `kvwatch loadgen search` directory.

SLO attainment and preemptions per second against load, the SLO limit and the KV onset marked,
the table of loads, and the sizing advice at the binding point (from that probe's own run
directory). Self-contained like the run report: inline CSS and SVG, no script.
"""

from __future__ import annotations

import json
import time
from html import escape
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import EXIT_USAGE, CliError
from kvwatch.loadgen.cmd_search import SEARCH_FILE, render_search
from kvwatch.loadgen.results.run_files import read_run
from kvwatch.report.parts import CSS, advice_html, model_html
from kvwatch.report.svgplot import Line, Mark, line_chart

__all__ = ["is_search_dir", "render_capacity"]


def is_search_dir(run_dir: Path) -> bool:
    return (run_dir / SEARCH_FILE).is_file()


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_verdict(v: object, where: str) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise ValueError(f"{where} is not an object")
    iv = v.get("interval95")
    if not (
        _number(v.get("load")) and _number(v.get("attainment")) and _number(v.get("requests"))
        and isinstance(iv, list) and len(iv) == 2 and all(map(_number, iv))
        and (v.get("preemptions_per_s") is None or _number(v.get("preemptions_per_s")))
        and isinstance(v.get("probes"), list) and all(isinstance(p, str) for p in v["probes"])
    ):  # fmt: skip
        raise ValueError(f"{where}: load, attainment, requests, interval95 and probes expected")


def _load(run_dir: Path) -> dict[str, Any]:
    """search.json, checked: it is a file from outside like any other input."""
    path = run_dir / SEARCH_FILE
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("kind") != "capacity_search":
            raise ValueError("not a capacity search")
        res = doc.get("result")
        if not isinstance(res, dict) or res.get("by") not in ("concurrency", "rate"):
            raise ValueError("no result")
        if not _number(res.get("attainment_target")):
            raise ValueError("no attainment target")
        for key in ("max_ok", "min_fail", "kv_onset", "kv_clean"):
            _check_verdict(res.get(key), f"result.{key}")
        if not isinstance(doc.get("loads"), list) or not isinstance(doc.get("probes"), list):
            raise ValueError("no loads or probes")
        for i, v in enumerate(doc["loads"]):
            _check_verdict(v, f"loads[{i}]")
        for i, p in enumerate(doc["probes"]):
            if not (
                isinstance(p, dict) and isinstance(p.get("name"), str)
                and all(_number(p.get(k)) for k in ("load", "requests", "attained", "duration_s"))
                and (p.get("preemptions") is None or _number(p.get("preemptions")))
            ):  # fmt: skip
                raise ValueError(f"probes[{i}]: name, load, requests, attained expected")
        slo = doc.get("slo")
        if not isinstance(slo, dict) or not all(map(_number, slo.values())):
            raise ValueError("no SLOs")
        if not isinstance(doc.get("plan"), dict) or not _number(doc["plan"].get("max_load")):
            raise ValueError("no plan")
    except OSError as e:
        raise CliError(f"{path}: {e.strerror}") from None
    except ValueError as e:  # JSON errors are ValueErrors too
        raise CliError(f"{path}: not a readable capacity search ({e})", EXIT_USAGE) from None
    return doc


def render_capacity(run_dir: Path) -> str:
    doc = _load(run_dir)
    res = doc["result"]
    by, target = res["by"], res["attainment_target"]
    unit = "in flight" if by == "concurrency" else "req/s"
    loads = doc["loads"]
    limit = "SLO limit" if res["min_fail"] is not None else "met SLOs up to the maximum"
    marks = [
        Mark(res[k]["load"], label)
        for k, label in (("max_ok", limit), ("kv_onset", "KV onset"))
        if res[k] is not None
    ]
    x_range = (min(v["load"] for v in loads), max(v["load"] for v in loads)) if loads else None
    attain = line_chart(
        f"Requests meeting every SLO, against load ({unit})",
        [
            Line("met the SLOs", [(v["load"], v["attainment"]) for v in loads]),
            Line("95% interval, low", [(v["load"], v["interval95"][0]) for v in loads]),
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
                [
                    (v["load"], v["preemptions_per_s"])
                    for v in loads
                    if v["preemptions_per_s"] is not None
                ],
            )
        ],  # fmt: skip
        marks=marks,
        relative_x=True,
        x_range=x_range,
        x_unit="",
    )
    slo = ", ".join(f"{k} &le; {v * 1000:.0f} ms" for k, v in doc["slo"].items())
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc.get("started_unix") or 0))
    binding = res["binding"] or (
        "none found: no load up to the maximum failed the SLOs"
        if res["min_fail"] is None
        else "none found"
    )
    verdict_class = "good" if res["max_ok"] is not None else "bad"
    found = render_search(doc).split("\n\n", 1)[-1].splitlines()
    summary = "".join(f"<p>{escape(line)}</p>" for line in found)
    advice_at = (res["kv_onset"] or res["min_fail"] or {}).get("probes") or []
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
    for p in doc["probes"]:
        pre = "-" if p["preemptions"] is None else f"{p['preemptions']:.0f}"
        rows.append(
            f"<tr><td>{escape(p['name'])}</td><td class='n'>{p['load']:g}</td>"
            f"<td class='n'>{p['requests']}</td><td class='n'>{p['attained']}</td>"
            f"<td class='n'>{pre}</td><td class='n'>{p['duration_s']:.0f}</td></tr>"
        )
    probes = "".join(rows)
    body = [
        f"<h1>kvwatch capacity: {escape(run_dir.name)}</h1>",
        f"<p class='sub'>{escape(str(doc.get('target')))} &middot; model "
        f"{model_html(doc.get('model'))} &middot; started {started} &middot; "
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
