"""Where what the sidecar knows leaves it: its own HTTP endpoint (exporter: /metrics,
/healthz, /api/state, /api/episodes, the token-guarded POST /api/events), its alerts
(alerting: what is firing, what changed) and the webhooks that deliver them through the
outbox (webhooks). Reads the state's views; never writes the state."""

from __future__ import annotations

__all__: list[str] = []
