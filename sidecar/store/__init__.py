"""What survives a restart, in one private SQLite file: the file itself (database), the
durable webhook outbox (outbox), the thrashing episodes (episode_store) and the alerts firing
(firing_store). Every SQL statement of the sidecar is here. Stores what the judge and the
alerting made; decides nothing."""

from __future__ import annotations

__all__: list[str] = []
