"""What survives a restart, in one private SQLite file: the file itself (database), the
durable webhook outbox (outbox) and the thrashing episodes (episode_store). Stores what the
judge made; decides nothing."""

from __future__ import annotations

__all__: list[str] = []
