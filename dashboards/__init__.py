"""Grafana dashboards built with grafana-foundation-sdk from the sidecar's metric vocabulary.

Imports flow one way: this package reads `sidecar.vocabulary`, never the reverse.
"""

from __future__ import annotations

__all__: list[str] = []
