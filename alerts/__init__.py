"""Prometheus recording and alerting rules generated from the sidecar's vocabulary and thresholds.

Imports flow one way: this package reads `sidecar`, never the reverse.
"""

from __future__ import annotations

__all__: list[str] = []
