"""`kvwatch advise`: the command (command), where it reads what a server saw (sources: a run
directory, a live sidecar, a /metrics URL; prometheus: Prometheus history), and the what-if for
a model and GPU not deployed yet (whatif). The arithmetic itself is kvwatch.sizing's."""

from __future__ import annotations

__all__: list[str] = []
