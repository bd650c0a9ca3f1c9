"""A durable, ordered outbox per webhook receiver, in SQLite.

A notification is written here before any attempt to send it, and marked delivered only after
the receiver answered 2xx, so a receiver that is down for minutes, or a sidecar killed with
SIGKILL, loses nothing. Each receiver gets its messages in order: the next is not tried before
the one ahead of it is delivered (or dropped). Retries back off exponentially with jitter. When a
receiver is gone for good the outbox is bounded: past `max_pending` the oldest are dropped,
counted and logged. Every message carries a delivery id a receiver can use to drop the rare
duplicate (a crash between the receiver's 2xx and our commit).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass

__all__ = ["Outbox", "Pending", "DeliveryStats"]


_VACUUM_AFTER = 10_000  # purged rows at start past which the file is compacted


@dataclass(frozen=True)
class DeliveryStats:
    """One receiver's notifications: waiting to be sent, delivered, dropped from a full box."""

    pending: int
    delivered: int
    dropped: int


@dataclass(frozen=True)
class Pending:
    id: int
    receiver: str
    body: bytes
    attempts: int
    next_at: float


class Outbox:
    """`keep_delivered`: delivered messages kept per receiver (a short history to look at);
    older ones are purged, and counted, so the table and every query stay small."""

    def __init__(
        self, db: sqlite3.Connection, max_pending: int = 10_000, keep_delivered: int = 1_000
    ) -> None:
        self.db = db
        self.max_pending = max_pending
        self.keep_delivered = keep_delivered
        self.dropped: dict[str, int] = {}
        self._lock = threading.Lock()
        with self._lock, self.db:
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "receiver TEXT, body BLOB, created REAL, attempts INTEGER DEFAULT 0, "
                "next_at REAL, delivered REAL, last_error TEXT)"
            )
            self.db.execute(
                "CREATE INDEX IF NOT EXISTS outbox_by_receiver ON outbox (receiver, delivered, id)"
            )
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS outbox_purged (receiver TEXT PRIMARY KEY, n INTEGER)"
            )
            # an outbox an older sidecar let grow is trimmed at once
            receivers = self.db.execute("SELECT DISTINCT receiver FROM outbox").fetchall()
            trimmed = sum(self._purge(r) for (r,) in receivers)
        if trimmed > _VACUUM_AFTER:  # and its file given back (outside the transaction)
            self.db.execute("VACUUM")
            # VACUUM wrote the whole file into the WAL: copy it back and cut the WAL to nothing,
            # or the disk stays as large as before the trim until the process exits
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def rename(self, old: str, new: str) -> None:
        """Move a receiver's messages to its new key (an outbox from before keys were
        redacted named receivers by their whole URL)."""
        if old == new:
            return
        with self._lock, self.db:
            self.db.execute("UPDATE outbox SET receiver = ? WHERE receiver = ?", (new, old))
            self.db.execute("UPDATE outbox_purged SET receiver = ? WHERE receiver = ?", (new, old))

    def put(self, receiver: str, body: bytes, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._lock, self.db:
            cur = self.db.execute(
                "INSERT INTO outbox (receiver, body, created, next_at) VALUES (?, ?, ?, ?)",
                (receiver, body, now, now),
            )
            pending = self.db.execute(
                "SELECT COUNT(*) FROM outbox WHERE receiver = ? AND delivered IS NULL", (receiver,)
            ).fetchone()[0]
            over = pending - self.max_pending
            if over > 0:
                self.db.execute(
                    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE receiver = ? "
                    "AND delivered IS NULL ORDER BY id LIMIT ?)",
                    (receiver, over),
                )
                self.dropped[receiver] = self.dropped.get(receiver, 0) + over
            return int(cur.lastrowid or 0)

    def head(self, receiver: str) -> Pending | None:
        """The oldest undelivered message for the receiver (the only one that may be tried)."""
        with self._lock:
            row = self.db.execute(
                "SELECT id, receiver, body, attempts, next_at FROM outbox WHERE receiver = ? AND "
                "delivered IS NULL ORDER BY id LIMIT 1",
                (receiver,),
            ).fetchone()
        return None if row is None else Pending(*row)

    def delivered(self, msg_id: int, now: float | None = None) -> None:
        with self._lock, self.db:
            row = self.db.execute(
                "UPDATE outbox SET delivered = ? WHERE id = ? RETURNING receiver",
                (time.time() if now is None else now, msg_id),
            ).fetchone()
            if row is None:
                return
            self._purge(row[0])

    def _purge(self, receiver: str) -> int:
        """Delivered messages past the newest `keep_delivered` go (the caller holds the lock
        and the transaction); returns how many."""
        cut = self.db.execute(
            "SELECT id FROM outbox WHERE receiver = ? AND delivered IS NOT NULL "
            "ORDER BY id DESC LIMIT 1 OFFSET ?",
            (receiver, self.keep_delivered),
        ).fetchone()
        if cut is None:
            return 0
        gone: int = self.db.execute(
            "DELETE FROM outbox WHERE receiver = ? AND delivered IS NOT NULL AND id <= ?",
            (receiver, cut[0]),
        ).rowcount
        self.db.execute(
            "INSERT INTO outbox_purged VALUES (?, ?) "
            "ON CONFLICT (receiver) DO UPDATE SET n = n + excluded.n",
            (receiver, gone),
        )
        return gone

    def failed(self, msg_id: int, error: str, retry_at: float) -> None:
        with self._lock, self.db:
            self.db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?, "
                "last_error = ? WHERE id = ?",
                (retry_at, error[:500], msg_id),
            )

    def stats(self) -> dict[str, DeliveryStats]:
        with self._lock:
            rows = self.db.execute(
                "SELECT receiver, SUM(delivered IS NULL), SUM(delivered IS NOT NULL) FROM outbox "
                "GROUP BY receiver"
            ).fetchall()
            purged = dict(self.db.execute("SELECT receiver, n FROM outbox_purged").fetchall())
        return {
            r: DeliveryStats(int(p or 0), int(d or 0) + purged.get(r, 0), self.dropped.get(r, 0))
            for r, p, d in rows
        }
