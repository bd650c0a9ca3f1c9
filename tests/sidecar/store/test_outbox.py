"""The webhook outbox's table: a bounded history, and an old sidecar's grown file trimmed and
given back to the disk while the sidecar runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kvwatch.sidecar.store.database import connect
from kvwatch.sidecar.store.outbox import DeliveryStats, Outbox


def test_the_outbox_keeps_a_bounded_history_and_counts_what_it_purged() -> None:
    outbox = Outbox(sqlite3.connect(":memory:"), keep_delivered=10)
    for _ in range(50):
        msg_id = outbox.put("r", b"{}")
        outbox.delivered(msg_id)
    outbox.put("r", b"{}")
    rows = outbox.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
    assert rows == 11  # 10 delivered kept, 1 pending
    assert outbox.stats()["r"] == DeliveryStats(pending=1, delivered=50, dropped=0)
    plan = " ".join(
        str(r) for r in outbox.db.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM outbox WHERE receiver = 'r' AND "
            "delivered IS NULL ORDER BY id LIMIT 1"
        )
    )  # fmt: skip
    assert "outbox_by_receiver" in plan


def test_an_outbox_an_older_sidecar_grew_is_trimmed_and_compacted(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = Outbox(sqlite3.connect(path), keep_delivered=10**9)  # an outbox that never purged
    old.db.executemany(
        "INSERT INTO outbox (receiver, body, created, next_at, delivered) VALUES ('r', ?, 0, 0, 1)",
        ((b"x" * 200,) for _ in range(20_000)),
    )
    old.db.commit()
    old.db.close()
    grown = path.stat().st_size
    box = Outbox(sqlite3.connect(path))
    assert box.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1_000
    assert box.stats()["r"].delivered == 20_000
    assert path.stat().st_size < grown / 5


def test_the_trim_gives_the_disk_back_while_the_sidecar_runs(tmp_path: Path) -> None:
    """As the sidecar opens it (WAL): VACUUM wrote the whole file into the WAL, which stayed
    at that size until the process exited (602 MiB after a trim of 300k rows)."""
    path = tmp_path / "old.db"
    old = Outbox(connect(path), keep_delivered=10**9)
    old.db.executemany(
        "INSERT INTO outbox (receiver, body, created, next_at, delivered) VALUES ('r', ?, 0, 0, 1)",
        ((b"x" * 1000,) for _ in range(30_000)),
    )
    old.db.commit()
    old.db.close()
    grown = path.stat().st_size
    assert grown > 30e6
    box = Outbox(connect(path))  # held open, as the running sidecar holds it
    wal = path.with_name(path.name + "-wal")
    on_disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert on_disk < 8e6, f"{on_disk / 1e6:.0f} MB after the trim, {grown / 1e6:.0f} before"
    assert box.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1_000
    box.db.close()
