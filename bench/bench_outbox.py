"""The sidecar's CPU with a large webhook outbox left by a long run.

Writes a SQLite file with `--rows` delivered messages for one receiver (as a sidecar that never
purged them would leave it), starts a sidecar on it with that receiver (its target a closed
port: only the sender's work matters), and reads the sidecar's CPU share over `--seconds`.

    PYTHONPATH=. .venv/bin/python bench/bench_outbox.py [--rows 0,100000,300000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procfs import cpu_seconds

from kvwatch.local.server import free_port, stop_process, wait_until_ok
from kvwatch.sidecar.outputs.webhooks import Receiver
from tests.receiver import receiver


def _old_outbox(path: Path, key: str, rows: int) -> None:
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT, body BLOB, "
        "created REAL, attempts INTEGER DEFAULT 0, next_at REAL, delivered REAL, last_error TEXT)"
    )
    now = time.time()
    db.executemany(
        "INSERT INTO outbox (receiver, body, created, next_at, delivered) VALUES (?, ?, ?, ?, ?)",
        ((key, b'{"delivery_id": "x", "payload": {}}', now, now, now) for _ in range(rows)),
    )
    db.commit()
    db.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="0,100000,300000")
    p.add_argument("--seconds", type=float, default=20.0)
    ns = p.parse_args()
    with receiver() as (hook, _), tempfile.TemporaryDirectory() as tmp:
        for rows in (int(r) for r in ns.rows.split(",")):
            db = Path(tmp) / f"outbox-{rows}.db"
            _old_outbox(db, Receiver(hook).key, rows)
            port = free_port()
            cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--target",
                   f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{port}",
                   "--db", str(db), "--webhook", hook]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if not wait_until_ok(f"http://127.0.0.1:{port}/healthz", proc, 30):
                    raise SystemExit("the sidecar did not start")
                time.sleep(2)
                c0, t0 = cpu_seconds(proc.pid), time.monotonic()
                time.sleep(ns.seconds)
                share = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
            finally:
                stop_process(proc)
            left = sqlite3.connect(db).execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
            print(f"{rows:>7,} delivered rows at start: sidecar CPU {share:.1%} of a core; "
                  f"{left:,} rows kept; file {db.stat().st_size / 1e6:.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
