"""What was seen: the request records, the server's own view from /metrics, the summaries,
stall causes, the working set, the run directory and its schema. Imports no other loadgen
room.
"""

from __future__ import annotations

__all__: list[str] = []
