"""The sidecar's own alerts: which are active now, and what changed since the last look.

Alert names match the Prometheus rules (alerts/runbook.md) where they mean the same thing. An
alert is keyed by a fingerprint of its labels; the tracker turns the active set into firing,
repeat and resolved notifications, and keeps what is firing in SQLite so a restarted sidecar
neither re-announces nor forgets an alert.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any

from kvwatch.sidecar.thresholds import Thresholds

__all__ = ["Alert", "active_alerts", "AlertTracker", "Notification"]

_LEVEL_ALERTS = {
    "pressure": ("KvwatchKvCachePressure", "warning", "KV cache usage is high"),
    "saturated": ("KvwatchKvCacheSaturated", "critical", "KV cache full with requests waiting"),
    "thrashing": ("KvwatchThrashing", "critical", "preemption thrashing"),
}


@dataclass(frozen=True)
class Alert:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]

    @property
    def fingerprint(self) -> str:
        blob = json.dumps({"alertname": self.name, **self.labels}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Notification:
    status: str  # "firing" or "resolved"
    alert: Alert
    starts_at: float
    ends_at: float | None = None
    repeat: bool = False


def _episode_text(e: dict[str, Any]) -> str:
    ep = e.get("episode")
    if not ep:
        return ""
    return (
        f" Episode so far: {ep['preemptions']:.0f} preemptions, "
        f"{ep['repeat_preempted']:.0f} repeat victims, peak KV {ep['peak_kv']:.0%}, "
        f"~{ep['tokens_recomputed']:,.0f} tokens recomputed."
    )


def _advice_text(e: dict[str, Any]) -> str:
    s = e["signals"]
    if not (s.get("capacity_blocks") and s.get("block_size") and s.get("peak_demand_long")):
        return ""
    return (
        f" Peak demand {s['peak_demand_long']:.0f} requests on {s['capacity_blocks']} blocks "
        f"of {s['block_size']} tokens: run `kvwatch advise --sidecar` for the settings."
    )


def active_alerts(snapshot: dict[str, Any], th: Thresholds, now_unix: float) -> list[Alert]:
    """Alerts that hold in this state snapshot (the one /api/state serves)."""
    out = []
    for t in snapshot["targets"]:
        target = t["target"]
        last_ok = t.get("last_success_unix")
        down_for = (
            None if t["up"] is not False else now_unix - (last_ok or snapshot["started_unix"])
        )
        if down_for is not None and down_for >= th.target_down_after_s:
            out.append(
                Alert(
                    "KvwatchTargetDown",
                    {"target": target, "severity": "warning"},
                    {
                        "summary": f"kvwatch cannot scrape {target}",
                        "description": f"Scrapes failed for {down_for:.0f} s: {t['last_error']}",
                    },
                )
            )
        if t["up"] and t.get("vllm_metrics_present") is False:
            out.append(
                Alert(
                    "KvwatchVllmMetricsMissing",
                    {"target": target, "severity": "warning"},
                    {
                        "summary": f"{target} exports no vLLM engine metrics",
                        "description": "The server answers /metrics without vllm engine series "
                        "(started with --disable-log-stats?).",
                    },
                )
            )
        for e in t["engines"]:
            if not e["present"] or e["state"] not in _LEVEL_ALERTS:
                continue
            name, severity, what = _LEVEL_ALERTS[e["state"]]
            labels = {
                "target": target,
                "model_name": e["model_name"],
                "engine": e["engine"],
                "severity": severity,
            }
            reasons = "; ".join(e["state_reasons"])
            out.append(
                Alert(
                    name,
                    labels,
                    {
                        "summary": f"vLLM {what} on {target} "
                        f"({e['model_name']}, engine {e['engine']})",
                        "description": f"{reasons}.{_episode_text(e)}{_advice_text(e)}",
                    },
                )
            )
    return out


@dataclass
class _Firing:
    alert: Alert
    starts_at: float
    last_sent: float


@dataclass
class AlertTracker:
    """Turns successive active sets into notifications; what fires survives in SQLite."""

    db: sqlite3.Connection
    repeat_interval_s: float
    firing: dict[str, _Firing] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        with self._lock, self.db:
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS firing (fingerprint TEXT PRIMARY KEY, "
                "alert TEXT, starts_at REAL, last_sent REAL)"
            )
            for fp, blob, starts, sent in self.db.execute("SELECT * FROM firing"):
                d = json.loads(blob)
                self.firing[fp] = _Firing(
                    Alert(d["name"], d["labels"], d["annotations"]), starts, sent
                )

    def update(self, active: list[Alert], now: float) -> list[Notification]:
        out: list[Notification] = []
        with self._lock, self.db:
            seen = set()
            for a in active:
                fp = a.fingerprint
                seen.add(fp)
                f = self.firing.get(fp)
                if f is None:
                    f = self.firing[fp] = _Firing(a, now, now)
                    out.append(Notification("firing", a, now))
                elif now - f.last_sent >= self.repeat_interval_s:
                    f.alert, f.last_sent = a, now
                    out.append(Notification("firing", a, f.starts_at, repeat=True))
                else:
                    f.alert = a  # keep the newest figures for the resolve message
                self.db.execute(
                    "INSERT OR REPLACE INTO firing VALUES (?, ?, ?, ?)",
                    (fp, json.dumps(f.alert.__dict__), f.starts_at, f.last_sent),
                )
            for fp in [fp for fp in self.firing if fp not in seen]:
                f = self.firing.pop(fp)
                out.append(Notification("resolved", f.alert, f.starts_at, ends_at=now))
                self.db.execute("DELETE FROM firing WHERE fingerprint = ?", (fp,))
        return out
