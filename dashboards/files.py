"""The dashboards kvwatch ships: their file names, known without the Grafana SDK."""

from __future__ import annotations

__all__ = ["DASHBOARD_FILES"]

DASHBOARD_FILES = ("kvwatch-kv-pressure.json", "kvwatch-fleet.json")
