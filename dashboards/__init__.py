"""Grafana dashboards built with grafana-foundation-sdk from the sidecar's metric vocabulary
(build, queries, files), and the command that writes them (command.py parses, run.py handles).

Imports flow one way: this package reads `sidecar.contract`, never the reverse.
"""

from __future__ import annotations

__all__: list[str] = []
