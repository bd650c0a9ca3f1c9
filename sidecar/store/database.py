"""The sidecar's SQLite file (episodes, firing alerts, the webhook outbox): created private
(0600, as are its WAL and shared-memory files, which SQLite gives the database's mode), since the
outbox holds alert payloads and receiver names.

WAL with synchronous=NORMAL: a commit is a write to the WAL, not an fsync. A killed sidecar loses
nothing (the OS has the pages); only a power cut can lose the last commits, and never corrupts
the file. With the default FULL, every tick's commit waited for the disk: on a shared CI disk
that took seconds, and the sidecar stopped scraping while it said up."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

__all__ = ["connect"]


def connect(path: Path | None) -> sqlite3.Connection:
    """A connection for any thread; `None` keeps everything in memory."""
    if path is None:
        return sqlite3.connect(":memory:", check_same_thread=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)  # an older sidecar may have made it 0644
    db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db
