"""search.json (`kvwatch loadgen search`) read back as typed values, and said in words: the
terminal's table and verdict, and what the capacity page draws.

The file is input from outside like any run file: `search_from_doc` checks every field a
reader uses and refuses a file that lacks one, in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.loadgen.results.run_schema import NUM, STAMP, Cleaned, clean

__all__ = [
    "SEARCH_FILE", "Verdict", "ProbeRow", "SearchAdvice", "SearchFile", "search_from_doc",
    "read_search", "render_search",
]  # fmt: skip

SEARCH_FILE = "search.json"


def _number(x: object) -> bool:
    """A number as run_schema's NUM holds it: finite (JSON's Infinity and NaN read as floats,
    and a chart cannot place them), not a bool, below 1e15."""
    return x is not None and clean(x, NUM, Cleaned()) is not None


@dataclass(frozen=True)
class Verdict:
    """One load, its probes pooled: how many met the SLOs and what the cache did."""

    load: float
    probes: tuple[str, ...]
    requests: float
    attainment: float
    interval95: tuple[float, float]
    preemptions: float | None
    preemptions_per_s: float | None


@dataclass(frozen=True)
class ProbeRow:
    name: str
    load: float
    requests: float
    attained: float
    preemptions: float | None
    duration_s: float


@dataclass(frozen=True)
class SearchAdvice:
    probe: str
    verdict: str
    recommended: str | None


@dataclass(frozen=True)
class SearchFile:
    target: str | None
    model: str | None
    started_unix: float | None
    by: str  # "concurrency" or "rate"
    attainment_target: float
    slo: tuple[tuple[str, float], ...]  # name -> seconds
    max_load: float
    loads: tuple[Verdict, ...]
    probes: tuple[ProbeRow, ...]
    max_ok: Verdict | None
    min_fail: Verdict | None
    kv_onset: Verdict | None
    kv_clean: Verdict | None
    kv_ran_out: Verdict | None
    binding: str | None
    advice: SearchAdvice | None


def _verdict(v: object, where: str) -> Verdict | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"{where} is not an object")
    iv, pps, pre = v.get("interval95"), v.get("preemptions_per_s"), v.get("preemptions")
    if not (
        _number(v.get("load")) and _number(v.get("attainment")) and _number(v.get("requests"))
        and isinstance(iv, list) and len(iv) == 2 and all(map(_number, iv))
        and (pps is None or _number(pps)) and (pre is None or _number(pre))
        and isinstance(v.get("probes"), list) and all(isinstance(p, str) for p in v["probes"])
    ):  # fmt: skip
        raise ValueError(f"{where}: load, attainment, requests, interval95 and probes expected")
    return Verdict(
        float(v["load"]), tuple(v["probes"]), float(v["requests"]), float(v["attainment"]),
        (float(iv[0]), float(iv[1])), None if pre is None else float(pre),
        None if pps is None else float(pps),
    )  # fmt: skip


def _probe(p: object, where: str) -> ProbeRow:
    if not (
        isinstance(p, dict) and isinstance(p.get("name"), str)
        and all(_number(p.get(k)) for k in ("load", "requests", "attained", "duration_s"))
        and (p.get("preemptions") is None or _number(p.get("preemptions")))
    ):  # fmt: skip
        raise ValueError(f"{where}: name, load, requests, attained expected")
    pre = p.get("preemptions")
    return ProbeRow(
        p["name"], float(p["load"]), float(p["requests"]), float(p["attained"]),
        None if pre is None else float(pre), float(p["duration_s"]),
    )  # fmt: skip


def _advice(a: object) -> SearchAdvice | None:
    if not isinstance(a, dict) or not isinstance(a.get("probe"), str):
        return None
    rec = a.get("recommended")
    return SearchAdvice(
        a["probe"], str(a.get("verdict") or ""), rec if isinstance(rec, str) else None
    )


def search_from_doc(doc: Any) -> SearchFile:
    """search.json's document as typed values; ValueError, one line, naming what is missing."""
    if not isinstance(doc, dict) or doc.get("kind") != "capacity_search":
        raise ValueError("not a capacity search")
    res = doc.get("result")
    if not isinstance(res, dict) or res.get("by") not in ("concurrency", "rate"):
        raise ValueError("no result")
    if not _number(res.get("attainment_target")):
        raise ValueError("no attainment target")
    found = {k: _verdict(res.get(k), f"result.{k}")
             for k in ("max_ok", "min_fail", "kv_onset", "kv_clean", "kv_ran_out")}  # fmt: skip
    if not isinstance(doc.get("loads"), list) or not isinstance(doc.get("probes"), list):
        raise ValueError("no loads or probes")
    loads = tuple(_verdict(v, f"loads[{i}]") for i, v in enumerate(doc["loads"]))
    probes = tuple(_probe(p, f"probes[{i}]") for i, p in enumerate(doc["probes"]))
    slo = doc.get("slo")
    if not isinstance(slo, dict) or not all(map(_number, slo.values())):
        raise ValueError("no SLOs")
    plan = doc.get("plan")
    if not isinstance(plan, dict) or not _number(plan.get("max_load")):
        raise ValueError("no plan")
    binding = res.get("binding")
    return SearchFile(
        target=None if doc.get("target") is None else str(doc["target"]),
        model=None if doc.get("model") is None else str(doc["model"]),
        started_unix=clean(doc.get("started_unix"), STAMP, Cleaned()),
        by=res["by"],
        attainment_target=float(res["attainment_target"]),
        slo=tuple((str(k), float(v)) for k, v in slo.items()),
        max_load=float(plan["max_load"]),
        loads=tuple(v for v in loads if v is not None),
        probes=probes,
        binding=binding if isinstance(binding, str) else None,
        advice=_advice(doc.get("advice")),
        max_ok=found["max_ok"],
        min_fail=found["min_fail"],
        kv_onset=found["kv_onset"],
        kv_clean=found["kv_clean"],
        kv_ran_out=found["kv_ran_out"],
    )


def read_search(run_dir: Path) -> SearchFile:
    """A search directory's search.json, read once and checked. OSError where it cannot be
    read; ValueError, one line, where it is not a capacity search."""
    text = (run_dir / SEARCH_FILE).read_text()
    try:
        return search_from_doc(json.loads(text))
    except ValueError as e:  # JSON errors are ValueErrors too
        raise ValueError(f"not a readable capacity search ({e})") from None


def _unit(by: str) -> str:
    return "in flight" if by == "concurrency" else "req/s"


def _count(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def render_search(s: SearchFile) -> str:
    """The console's table (one row per load) and what it found."""
    by, t = s.by, s.attainment_target
    unit = _unit(by)
    marks: dict[float, list[str]] = {}
    labels = ("max meeting SLOs", "first failing", "KV onset", "last without preemption")
    for v, label in zip((s.max_ok, s.min_fail, s.kv_onset, s.kv_clean), labels, strict=True):
        if v is not None:
            marks.setdefault(v.load, []).append(label)
    rows = [("load", "probes", "requests", "met SLOs", "95% interval", "preempt/s", "")]
    for v in s.loads:
        lo, hi = v.interval95
        pps = v.preemptions_per_s
        rows.append((
            f"{v.load:g}", str(len(v.probes)), _count(v.requests), _pct(v.attainment),
            f"{_pct(lo)}-{_pct(hi)}", "-" if pps is None else f"{pps:.2f}",
            ", ".join(marks.get(v.load, [])),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    slo = ", ".join(f"{k} <= {v * 1000:.0f} ms" for k, v in s.slo)
    ok, fail = s.max_ok, s.min_fail
    if ok is None:
        lines.append(f"No load probed met the SLOs ({slo}) for {t:.0%} of requests.")
    else:
        lo, hi = ok.interval95
        lines.append(
            f"Highest load meeting the SLOs ({slo}) for {t:.0%} of requests: {ok.load:g} "
            f"{unit} ({_pct(ok.attainment)} of {_count(ok.requests)}, 95% interval "
            f"{_pct(lo)}-{_pct(hi)})."
        )
    if fail is not None:
        lo, hi = fail.interval95
        lines.append(
            f"Next above it, {fail.load:g} {unit}: {_pct(fail.attainment)} "
            f"(95% interval {_pct(lo)}-{_pct(hi)})."
        )
    else:
        lines.append(f"No load up to the maximum probed failed them ({s.max_load:g}).")
    onset, clean = s.kv_onset, s.kv_clean
    if onset is not None:
        below = "" if clean is None else f"; none at {clean.load:g}"
        lines.append(
            f"KV onset: preemption starts at {onset.load:g} {unit} "
            f"({onset.preemptions_per_s or 0:.2f}/s){below}."
        )
    else:
        top = max((v.load for v in s.loads), default=0)
        lines.append(f"KV onset: no preemption at any load probed (up to {top:g} {unit}).")
    ran_out = s.kv_ran_out
    if s.binding == "kv cache" and ran_out is not None:
        how = "preempting" if ran_out.preemptions else "queueing requests it had no room for"
        lines.append(
            f"The KV cache binds first: it had run out ({how}) at {ran_out.load:g} {unit}, "
            "by the load that failed."
        )
    elif s.binding == "compute":
        lines.append("Compute binds first: the SLOs failed on a cache that had not run out.")
    adv = s.advice
    if adv is not None:
        lines.append(f"Advice at {adv.probe}: {adv.verdict}")
        if adv.recommended:
            lines.append(f"Recommended: {adv.recommended}")
    return "\n".join(lines)
