"""What the benches beside a sidecar share: its engines sampled once a second from
`/api/state` while a load runs, and the samples and figures written as PREFIX.jsonl and
PREFIX.json."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

__all__ = ["sample_engines", "write_results"]

Row = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (engine, signals) -> row


def sample_engines(side: str, until: threading.Event, rows: list[dict[str, Any]],
                   phase: list[str], row: Row) -> None:  # fmt: skip
    """Until `until` is set, once a second: a row per engine, stamped with the time and the
    phase (`phase[0]`, which the caller may change); a failed read is skipped."""
    while not until.wait(1.0):
        try:
            state = httpx.get(f"{side}/api/state", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            continue
        for t in state.get("targets", []):
            for e in t.get("engines", []):
                rows.append({"t": time.time(), "phase": phase[0], **row(e, e.get("signals") or {})})


def write_results(out: Path, rows: list[dict[str, Any]], figures: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
