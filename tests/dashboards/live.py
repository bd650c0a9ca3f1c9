"""Run a dashboard's queries on a real Prometheus the way Grafana would.

Grafana fills the template variables (each from its own `label_values` query), replaces
`$__rate_interval` and `$__range`, and sends each panel target as a range or an instant query.
This module does the same without Grafana, so a test can prove that every panel returns data
and the docs can plot what the panels would show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "PanelQuery", "panel_queries", "annotation_queries", "fill_variables", "substitute",
    "run_query", "Series", "grafana_regex_escape",
]  # fmt: skip

_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)\s*$")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    panel_type: str
    ref: str
    expr: str
    legend: str
    instant: bool
    unit: str


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix time, value); one point for instant queries


def panel_queries(doc: dict[str, Any]) -> list[PanelQuery]:
    out = []
    for p in doc.get("panels", []):
        panels = p.get("panels", []) if p.get("type") == "row" else [p]
        for panel in panels:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            for t in panel.get("targets", []):
                out.append(
                    PanelQuery(
                        panel=panel["title"],
                        panel_type=panel["type"],
                        ref=t["refId"],
                        expr=t["expr"],
                        legend=t.get("legendFormat", ""),
                        instant=bool(t.get("instant")),
                        unit=unit,
                    )
                )
    return out


def annotation_queries(doc: dict[str, Any]) -> dict[str, str]:
    return {
        a["name"]: a["target"]["expr"]
        for a in doc.get("annotations", {}).get("list", [])
        if "expr" in a.get("target", {})
    }


def substitute(expr: str, values: dict[str, str], range_s: float, rate_interval: str) -> str:
    """Grafana's substitution: variables by name (longest first), then the built-ins."""
    out = expr.replace("$__rate_interval", rate_interval)
    out = out.replace("$__range", f"{max(1, round(range_s))}s")
    for name in sorted(values, key=len, reverse=True):
        out = out.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return out


def fill_variables(
    client: httpx.Client, prom: str, doc: dict[str, Any], start: float, end: float
) -> dict[str, str]:
    """Each query variable set to its first value, asked of Prometheus as Grafana asks it
    (`/api/v1/label/<name>/values?match[]=...`), in dashboard order so later ones see earlier.
    Raises LookupError when a variable has no values: its panels would all be empty."""
    values: dict[str, str] = {}
    for v in doc.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        m = _LABEL_VALUES.match(str(v["query"]))
        if m is None:
            raise ValueError(f"variable {v['name']}: not a label_values query: {v['query']}")
        selector, label = m.group(1), m.group(2)
        params: dict[str, Any] = {"start": start, "end": end}
        if selector:
            params["match[]"] = substitute(selector, values, end - start, "1m")
        r = client.get(f"{prom}/api/v1/label/{label}/values", params=params)
        r.raise_for_status()
        found = sorted(r.json()["data"])
        if not found:
            raise LookupError(f"variable {v['name']}: no values for {v['query']}")
        values[v["name"]] = grafana_regex_escape(found[0])
    return values


def grafana_regex_escape(value: str) -> str:
    """A variable value as Grafana's Prometheus data source writes it into `=~"..."`: regex
    specials escaped, and the escape itself doubled for the PromQL string."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def run_query(
    client: httpx.Client, prom: str, expr: str, start: float, end: float, instant: bool, step: float
) -> list[Series]:
    if instant:
        r = client.get(f"{prom}/api/v1/query", params={"query": expr, "time": end})
    else:
        params: dict[str, str | float] = {"query": expr, "start": start, "end": end, "step": step}
        r = client.get(f"{prom}/api/v1/query_range", params=params)
    body = r.json()
    if body.get("status") != "success":
        raise ValueError(f"Prometheus refused {expr}: {body.get('error', r.text[:200])}")
    out = []
    for s in body["data"]["result"]:
        pts = [s["value"]] if "value" in s else s["values"]
        out.append(Series(s["metric"], [(float(t), float(v)) for t, v in pts]))
    return out
