"""`kvwatch advise` and `kvwatch calibrate`: the parsers (command), the handlers (run,
calibrate), where they read what a server saw (sources: a run directory, a live sidecar, a
/metrics URL; prometheus: Prometheus history, through kvwatch.common's PromQL reader;
server_readings: the live slices a calibration fits), and the what-if for a model and GPU not
deployed yet (whatif). The arithmetic itself is kvwatch.sizing's."""

from __future__ import annotations

__all__: list[str] = []
