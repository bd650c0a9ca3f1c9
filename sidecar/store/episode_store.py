"""The thrashing episodes' table in the sidecar's SQLite file: what survives a restart (an
episode a killed sidecar left open is closed as "sidecar restart" by the next one)."""

from __future__ import annotations

import threading
from dataclasses import fields
from pathlib import Path

from kvwatch.sidecar.judge.episodes import Episode
from kvwatch.sidecar.store.database import connect

__all__ = ["EpisodeStore"]

_COLUMNS = [f.name for f in fields(Episode) if f.name != "id"]


class EpisodeStore:
    """SQLite table of episodes. `path=None` keeps them in memory only."""

    def __init__(self, path: Path | None) -> None:
        self._db = connect(path)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS episodes (id INTEGER PRIMARY KEY, "
                + ", ".join(_COLUMNS)
                + ")"
            )

    def close_dangling(self, now_unix: float) -> int:
        """Episodes a previous sidecar left open (it was killed) end now; returns how many."""
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE episodes SET end_unix = ?, closed_by = 'sidecar restart' "
                "WHERE end_unix IS NULL",
                (now_unix,),
            )
            return cur.rowcount

    def save(self, ep: Episode) -> None:
        values = [getattr(ep, c) for c in _COLUMNS]
        with self._lock, self._db:
            if ep.id is None:
                cur = self._db.execute(
                    f"INSERT INTO episodes ({', '.join(_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                    values,
                )
                ep.id = cur.lastrowid
            else:
                sets = ", ".join(f"{c} = ?" for c in _COLUMNS)
                self._db.execute(f"UPDATE episodes SET {sets} WHERE id = ?", [*values, ep.id])

    def recent(self, limit: int = 50) -> list[Episode]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, {', '.join(_COLUMNS)} FROM episodes ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [Episode(**dict(zip(_COLUMNS, r[1:], strict=True)), id=r[0]) for r in rows]

    def counts(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT target, model_name, engine, COUNT(*) FROM episodes "
                "GROUP BY target, model_name, engine"
            ).fetchall()
        return {(t, m, e): n for t, m, e, n in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()
