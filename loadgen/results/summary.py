"""Summaries of a run: per stage and overall, from the flat request records (pandas).

Goodput counts the completed requests that met every SLO given (`--slo ttft=500ms,tpot=50ms`);
latencies are also summarised from the scheduled time, so a client-side queue cannot hide.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from kvwatch.loadgen.results.stall_causes import CAUSES

__all__ = [
    "parse_slo", "summarize_records", "render_table", "render_turns", "render_classes",
    "render_probes", "render_server_timings",
    "SLO_METRICS", "SloError",
    "timing_caveat", "causes_line",
]  # fmt: skip

SLO_METRICS = ("ttft", "tpot", "e2e", "ttft_from_scheduled", "e2e_from_scheduled")
_QUANTILES = (0.5, 0.9, 0.99)
_DURATION = re.compile(r"^([\d.]+)\s*(ms|s)?$")


class SloError(ValueError):
    pass


def parse_slo(spec: str) -> dict[str, float]:
    """`ttft=500ms,tpot=50ms,e2e=10s` -> seconds per metric."""
    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, sep, raw = item.partition("=")
        m = _DURATION.match(raw.strip())
        if not sep or key not in SLO_METRICS or m is None:
            names = ", ".join(SLO_METRICS)
            raise SloError(f"--slo {item!r}: use METRIC=VALUE[ms|s], METRIC one of {names}")
        value = float(m[1]) / (1000.0 if m[2] == "ms" else 1.0)
        if value <= 0:
            raise SloError(f"--slo {item!r}: the limit must be positive")
        out[key] = value
    return out


def _q(series: pd.Series) -> dict[str, float | None]:
    s = series.dropna()
    if s.empty:
        empty: dict[str, float | None] = {f"p{int(q * 100)}": None for q in _QUANTILES}
        return empty | {"mean": None, "max": None}
    out: dict[str, float | None] = {f"p{int(q * 100)}": float(s.quantile(q)) for q in _QUANTILES}
    out["mean"] = float(s.mean())
    out["max"] = float(s.max())
    return out


def _one(df: pd.DataFrame, slo: dict[str, float]) -> dict[str, Any]:
    ok = df[df["ok"]]
    if df.empty:
        return {"requests": 0}
    span_start = df["scheduled_at"].min()
    span_end = df["finished_at"].max()
    duration = float(span_end - span_start) if not math.isnan(span_end) else 0.0
    itl = pd.Series([g for gaps in ok["gaps"] for g in gaps], dtype=float)
    good = ok
    for metric, limit in slo.items():
        good = good[good[metric].notna() & (good[metric] <= limit)]
    errors = df.loc[~df["ok"], "error"].fillna("").str.split(":").str[0].value_counts()
    out_tokens = float(ok["output_tokens"].fillna(0).sum())
    return {
        "requests": int(len(df)),
        "completed": int(len(ok)),
        "failed": int(len(df) - len(ok)),
        "errors": {str(k): int(v) for k, v in errors.items()},
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_token_throughput": out_tokens / duration if duration > 0 else None,
        "input_token_throughput": (
            float(ok["prompt_tokens"].fillna(0).sum()) / duration if duration > 0 else None
        ),
        "goodput": (len(good) / duration if duration > 0 else None) if slo else None,
        "slo_attainment": (len(good) / len(df)) if slo else None,
        "ttft": _q(ok["ttft"]),
        "tpot": _q(ok["tpot"]),
        "itl": _q(itl),
        "e2e": _q(ok["e2e"]),
        "ttft_from_scheduled": _q(ok["ttft_from_scheduled"]),
        "e2e_from_scheduled": _q(ok["e2e_from_scheduled"]),
        "dispatch_lag": _q(df["dispatch_lag"]),
        "stalls": int(ok["stalls"].sum()),
        "requests_with_stalls": int((ok["stalls"] > 0).sum()),
        "stalls_preempting": _preempting(ok),
        **_stall_causes(ok),
        **_server_timings(ok),
    }


def _server_timings(ok: pd.DataFrame) -> dict[str, Any]:
    """vLLM's own timings beside the client's, where the server sent them
    (`--enable-per-request-metrics`): its queue time, its TTFT (from first scheduled: the queue
    left out), and what the client's TTFT adds to their sum (the HTTP front end, tokenizing,
    the network, the client)."""
    if "server_ttft" not in ok or "server_queue_time" not in ok:
        return {}
    both = ok[ok["server_ttft"].notna() & ok["server_queue_time"].notna() & ok["ttft"].notna()]
    if both.empty:
        return {}
    engine = both["server_queue_time"] + both["server_ttft"]
    return {"server_timings": {
        "requests": int(len(both)),
        "queue_time": _q(both["server_queue_time"]),
        "ttft_after_queue": _q(both["server_ttft"]),
        "ttft": _q(engine),
        "client_ttft": _q(both["ttft"]),
        "client_overhead": _q(both["ttft"] - engine),
    }}  # fmt: skip


def _stall_causes(ok: pd.DataFrame) -> dict[str, Any]:
    """Stalls and stall seconds by cause (loadgen/results/stall_causes.py), where they were
    judged: every cause named, the ones with none at 0."""
    if "stall_causes" not in ok or "stall_spans" not in ok:
        return {}
    out = {c: {"stalls": 0, "seconds": 0.0} for c in CAUSES}
    judged = False
    for causes, spans in zip(ok["stall_causes"], ok["stall_spans"], strict=True):
        if not isinstance(causes, list | tuple) or not isinstance(spans, list | tuple):
            continue
        for cause, span in zip(causes, spans, strict=False):
            if cause in out:
                judged = True
                out[cause]["stalls"] += 1
                out[cause]["seconds"] += float(span[1]) - float(span[0])
    return {"stall_causes": out} if judged else {}


def causes_line(causes: dict[str, Any] | None) -> str:
    """`preempted 3, recompute 5` (the causes with stalls, most first); "-" when not judged."""
    if not causes:
        return "-"
    got = sorted(((v["stalls"], c) for c, v in causes.items() if v.get("stalls")), reverse=True)
    return ", ".join(f"{c} {n}" for n, c in got) or "none"


def _preempting(ok: pd.DataFrame) -> int | None:
    """Stalls while the server preempted (loadgen/results/stall_causes.py); None unless every stall
    was judged."""
    if "stalls_preempting" not in ok:
        return None
    col = ok.loc[ok["stalls"] > 0, "stalls_preempting"]
    return None if col.isna().any() else int(col.sum())


def summarize_records(records: list[dict[str, Any]], slo: dict[str, float] | None = None
                      ) -> dict[str, Any]:  # fmt: skip
    """{"overall": ..., "stages": {name: ...}}; warm-up stages are left out of both."""
    slo = slo or {}
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return {"overall": {"requests": 0}, "stages": {}, "slo": slo}
    measured = df[~df["warmup"]] if "warmup" in df else df
    probes = None
    if "probe" in measured:
        is_probe = measured["probe"].fillna(False).astype(bool)
        if is_probe.any():
            probes, measured = measured[is_probe], measured[~is_probe]
    stages = {str(name): _one(g, slo) for name, g in measured.groupby("stage", sort=False)}
    out = {"overall": _one(measured, slo), "stages": stages, "slo": slo}
    if "session" in measured and measured["session"].notna().any():
        out["sessions"] = _sessions(measured[measured["session"].notna()])
    if "priority" in measured and measured["priority"].notna().any():
        out["classes"] = {
            str(int(prio)): _one(g, slo)  # type: ignore[arg-type]
            for prio, g in measured[measured["priority"].notna()].groupby("priority", sort=True)
        }
    if probes is not None:
        out["probes"] = {
            "overall": _one(probes, slo),
            "stages": {str(n): _one(g, slo) for n, g in probes.groupby("stage", sort=False)},
        }
    return out


def render_classes(summary: dict[str, Any]) -> str | None:
    """The per-class table of a run with priority classes (None for other runs)."""
    classes = summary.get("classes")
    if not classes:
        return None
    return "by priority class (lower runs first under vLLM's priority policy)\n" + render_table(
        {"stages": {f"priority {k}": v for k, v in classes.items()}, "overall": {}}
    )


def render_probes(summary: dict[str, Any]) -> str | None:
    """The probes' table, apart from the load's (None for a run without probes)."""
    probes = summary.get("probes")
    if not probes:
        return None
    table = render_table({"stages": {f"probes {k}": v for k, v in probes["stages"].items()},
                          "overall": {}})  # fmt: skip
    return "bystander probes (--probe-rate), left out of the load's figures\n" + table


def render_server_timings(summary: dict[str, Any]) -> str | None:
    """vLLM's own per-request timings beside the client's, for the load and the probes (None
    when the server sent none: it runs without `--enable-per-request-metrics`)."""
    lines = []
    for who, part in (("load", summary.get("overall")), ("probes",
                      (summary.get("probes") or {}).get("overall"))):  # fmt: skip
        t = (part or {}).get("server_timings")
        if not t:
            continue
        lines.append(
            f"{who}: vLLM queue {_ms(t['queue_time']['p50'])}/{_ms(t['queue_time']['p99'])} + "
            f"TTFT {_ms(t['ttft_after_queue']['p50'])}/{_ms(t['ttft_after_queue']['p99'])} ms; "
            f"client TTFT {_ms(t['client_ttft']['p50'])}/{_ms(t['client_ttft']['p99'])} ms, "
            f"of which outside the engine {_ms(t['client_overhead']['p50'])}/"
            f"{_ms(t['client_overhead']['p99'])} ms ({t['requests']} requests)"
        )
    if not lines:
        return None
    return "the server's own timings (p50/p99, --enable-per-request-metrics)\n" + "\n".join(lines)


def _sessions(df: pd.DataFrame) -> dict[str, Any]:
    """Per turn: how many, their prompts and TTFT. A cache that holds the conversations keeps
    a late turn's TTFT flat; one that evicted them recomputes the context, and TTFT grows."""
    ok = df[df["ok"]]
    turns = {}
    for turn, g in ok.groupby("turn", sort=True):
        turns[str(int(turn))] = {  # type: ignore[arg-type]
            "requests": int(len(g)),
            "prompt_tokens_mean": float(g["prompt_tokens"].mean()),
            "ttft": _q(g["ttft"]),
        }
    cut = df.loc[~df["ok"], "session"].nunique()
    return {"sessions": int(df["session"].nunique()), "cut": int(cut), "turns": turns}


def render_turns(summary: dict[str, Any]) -> str | None:
    """The per-turn table of a session run (None for other runs)."""
    s = summary.get("sessions")
    if not s:
        return None
    rows = [("turn", "requests", "prompt tokens", "TTFT p50/p99 ms")]
    for turn, v in s["turns"].items():
        rows.append((turn, str(v["requests"]), f"{v['prompt_tokens_mean']:.0f}",
                     f"{_ms(v['ttft']['p50'])}/{_ms(v['ttft']['p99'])}"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    cut = f", {s['cut']} cut short by a failed turn" if s["cut"] else ""
    return f"{s['sessions']} sessions{cut}\n{table}"


# Dispatch lag at which a run's own latencies deserve a caveat: TTFTs of tens of milliseconds
# are then partly the client's. The sender keeps p99 under 2 ms on an idle client host.
LAG_WARN_S = 0.010


def timing_caveat(summary: dict[str, Any], limit_s: float = LAG_WARN_S) -> str | None:
    """A warning when requests left notably later than scheduled, else None."""
    p99 = ((summary.get("overall") or {}).get("dispatch_lag") or {}).get("p99")
    if p99 is None or p99 <= limit_s:
        return None
    return (
        f"dispatch lag p99 {p99 * 1000:.0f} ms: requests left later than scheduled (more "
        "than one process can send, or a busy client host). Latencies `*_from_scheduled` "
        "include the delay; use --workers N or a quieter host."
    )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def render_table(summary: dict[str, Any]) -> str:
    rows = [("stage", "done/sent", "req/s", "tok/s", "TTFT p50/p99 ms", "TPOT p50 ms",
             "e2e p99 ms", "lag p99 ms", "stalls", "causes", "preempting",
             "goodput")]  # fmt: skip
    items = list(summary["stages"].items()) + [("overall", summary["overall"])]
    for name, s in items:
        if not s.get("requests"):
            continue
        rows.append((
            name,
            f"{s['completed']}/{s['requests']}",
            "-" if s["request_throughput"] is None else f"{s['request_throughput']:.2f}",
            "-" if s["output_token_throughput"] is None else f"{s['output_token_throughput']:.0f}",
            f"{_ms(s['ttft']['p50'])}/{_ms(s['ttft']['p99'])}",
            _ms(s["tpot"]["p50"]),
            _ms(s["e2e"]["p99"]),
            _ms(s["dispatch_lag"]["p99"]),
            f"{s['stalls']} in {s['requests_with_stalls']}",
            causes_line(s.get("stall_causes")) if s["stalls"] else "-",
            "-" if s.get("stalls_preempting") is None else str(s["stalls_preempting"]),
            "-" if s["goodput"] is None else f"{s['goodput']:.2f}/s",
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
