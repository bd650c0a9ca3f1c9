"""The firing alerts' table: what it holds survives a new connection, a tick's writes are one
transaction, and the tracker reads it back as the alerts it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kvwatch.sidecar.outputs.alerting import Alert, AlertTracker
from kvwatch.sidecar.store.firing_store import FiringRow, FiringStore

ROW = FiringRow("fp1", "KvwatchThrashing", {"engine": "0"}, {"summary": "s"}, 10.0, 12.0)


def test_rows_survive_a_new_connection(tmp_path: Path) -> None:
    store = FiringStore(sqlite3.connect(tmp_path / "s.db"))
    with store.batch():
        store.save(ROW)
        store.save(FiringRow("fp2", "KvwatchTargetDown", {}, {}, 1.0, 1.0))
        store.drop("fp2")
    assert FiringStore(sqlite3.connect(tmp_path / "s.db")).rows() == [ROW]


def test_a_failed_tick_writes_nothing(tmp_path: Path) -> None:
    store = FiringStore(sqlite3.connect(tmp_path / "s.db"))
    with pytest.raises(RuntimeError), store.batch():
        store.save(ROW)
        raise RuntimeError("the tick failed half way")
    assert FiringStore(sqlite3.connect(tmp_path / "s.db")).rows() == []


def test_the_tracker_restores_what_fired(tmp_path: Path) -> None:
    alert = Alert("KvwatchThrashing", {"engine": "0", "severity": "critical"}, {"summary": "s"})
    first = AlertTracker(FiringStore(sqlite3.connect(tmp_path / "s.db")), repeat_interval_s=60)
    (note,) = first.update([alert], 100.0)
    assert note.status == "firing"
    again = AlertTracker(FiringStore(sqlite3.connect(tmp_path / "s.db")), repeat_interval_s=60)
    (row,) = again.store.rows()
    assert (row.fingerprint, row.name, row.labels) == (alert.fingerprint, alert.name, alert.labels)
    assert again.update([alert], 110.0) == []  # neither announced again nor forgotten
    (resolved,) = again.update([], 120.0)
    assert resolved.status == "resolved" and resolved.starts_at == 100.0
    assert again.store.rows() == []
