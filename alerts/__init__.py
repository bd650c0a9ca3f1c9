"""Prometheus recording and alerting rules generated from the sidecar's vocabulary and thresholds
(build, rule, fleet, routing, autoscaling, chart), the runbook, and the commands that write
them (command.py parses, run.py handles).

Imports flow one way: this package reads `sidecar.contract`, never the reverse.
"""

from __future__ import annotations

__all__: list[str] = []
