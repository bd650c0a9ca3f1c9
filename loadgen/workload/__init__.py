"""What to send: each request's prompt and lengths (synthetic, a dataset, a trace, a
session's turns), its priority, when it is sent (arrivals, the stages of a run), the probes.
Pure but for reading a trace or dataset file and asking the server to tokenize. It shares its
floor with `results` and imports no other loadgen room.
"""

from __future__ import annotations

__all__: list[str] = []
