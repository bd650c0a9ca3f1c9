"""The sidecar's SQLite file (episodes, firing alerts, the webhook outbox): created private
(0600, as are its WAL and shared-memory files, which SQLite gives the database's mode), since the
outbox holds alert payloads and receiver names.

WAL with synchronous=NORMAL: a commit is a write to the WAL, not an fsync. A killed sidecar loses
nothing (the OS has the pages); only a power cut can lose the last commits, and never corrupts
the file. With the default FULL, every tick's commit waited for the disk: on a shared CI disk
that took seconds, and the sidecar stopped scraping while it said up.

The file is checked, created and chmod'ed once per process, before SQLite opens it, and never
opened by hand again: closing any descriptor of a file drops every POSIX lock the process holds
on it, SQLite's included. An outside reader (a backup, the sqlite3 shell) then saw no lock,
checkpointed and unlinked the live WAL, and the sidecar's later writes went to an unlinked file:
after a SIGKILL the restart sent an alert that was already delivered once more."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path

__all__ = ["connect", "check_database", "SQLITE_HEADER", "WAL_LIMIT_BYTES"]

SQLITE_HEADER = b"SQLite format 3\x00"
WAL_LIMIT_BYTES = 4 << 20
_prepared: set[str] = set()  # files this process has checked and created (and may hold locks on)
_lock = threading.Lock()


def check_database(path: Path) -> None:
    """ValueError, one line, when `path` cannot be the sidecar's database: a folder, under a
    file, or a file that is not SQLite. Reads 16 bytes at most and changes nothing; call it
    before any connection to the file is open in this process."""
    try:
        _check_database(path)
    except OSError as e:  # a name too long, a path under one it cannot search
        raise ValueError(f"--db {str(path)[:200]}: {e.strerror or e}") from None


def _check_database(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"--db {path}: a directory, not a database file")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"--db {path}: {ancestor} is not a directory")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as e:
        raise ValueError(f"--db {path}: cannot read it ({e.strerror})") from None
    if head != SQLITE_HEADER:
        raise ValueError(
            f"--db {path}: not an SQLite database (left as it is; point --db at a new file)"
        )


def _prepare(path: Path) -> None:
    """Check and create (0600) the file once per process, before SQLite opens it; make it
    private on every connect (by path: chmod opens no descriptor)."""
    key = str(path.resolve())
    with _lock:
        if key not in _prepared:
            check_database(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # no descriptor of an existing file
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            _prepared.add(key)
        os.chmod(path, 0o600)  # an older sidecar may have made it 0644


def connect(path: Path | None) -> sqlite3.Connection:
    """A connection for any thread; `None` keeps everything in memory."""
    if path is None:
        return sqlite3.connect(":memory:", check_same_thread=False)
    _prepare(path)
    db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    # after a checkpoint the WAL is cut back to this (SQLite keeps its largest size otherwise)
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    return db
