"""Everything the sidecar knows, behind one lock (sidecar_state), handed to readers as frozen
views built in one go (views), and the supervision that keeps every background loop running
(supervise). Writers are the scrape loops, the log reader and `POST /api/events`."""

from __future__ import annotations

__all__: list[str] = []
