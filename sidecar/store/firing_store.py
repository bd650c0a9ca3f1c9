"""The firing alerts' table in the sidecar's SQLite file: what fires survives a restart, so a
restarted sidecar neither re-announces nor forgets an alert (the tracker is outputs/alerting.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["FiringRow", "FiringStore"]


@dataclass(frozen=True)
class FiringRow:
    """One firing alert as stored: its fingerprint, what it says, and when it started and was
    last sent (Unix seconds)."""

    fingerprint: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    last_sent: float


class FiringStore:
    """The `firing` table of one connection; the caller serialises access (the tracker's lock)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        with db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS firing (fingerprint TEXT PRIMARY KEY, "
                "alert TEXT, starts_at REAL, last_sent REAL)"
            )

    def rows(self) -> list[FiringRow]:
        out = []
        for fp, blob, starts, sent in self._db.execute("SELECT * FROM firing"):
            d = json.loads(blob)
            out.append(FiringRow(fp, d["name"], d["labels"], d["annotations"], starts, sent))
        return out

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for a tick's writes."""
        with self._db:
            yield

    def save(self, row: FiringRow) -> None:
        blob = {"name": row.name, "labels": row.labels, "annotations": row.annotations}
        self._db.execute(
            "INSERT OR REPLACE INTO firing VALUES (?, ?, ?, ?)",
            (row.fingerprint, json.dumps(blob), row.starts_at, row.last_sent),
        )

    def drop(self, fingerprint: str) -> None:
        self._db.execute("DELETE FROM firing WHERE fingerprint = ?", (fingerprint,))
