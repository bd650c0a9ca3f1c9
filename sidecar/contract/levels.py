"""The four states kvwatch judges an engine to be in, worst last. A value of the contract: the
judge sets it, the exporter, alerts, dashboards and the report read its label."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Level"]


class Level(IntEnum):
    OK = 0
    PRESSURE = 1
    SATURATED = 2
    THRASHING = 3

    @property
    def label(self) -> str:
        return self.name.lower()
