"""The simulated card's timeline: when each step finishes, how busy the card was, how far behind.

A GPU runs one step at a time. A step handed over while the card is busy starts when it frees;
one handed over to an idle card starts at once. Every simulated duration is stretched by the
time scale K in wall time. When this machine's CPU cannot prepare the next step before the card
finishes the last one while requests are still running, the card sits idle with work waiting:
that idle time is the twin falling behind (its latencies are then this machine's, not the
card's), and it is counted apart from idle time with nothing to do. Pure: the caller passes the
wall clock in.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CardClock", "CardStatus"]


@dataclass(frozen=True)
class CardStatus:
    """One interval of the card's timeline, and the totals since start (wall seconds)."""

    time_scale: float
    interval_s: float
    busy_share: float  # of the interval's wall time, the card computing
    behind_share: float  # of the interval's wall time, idle while running requests waited
    steps: int  # in the interval
    simulated_s_total: float  # simulated seconds of computing since start (before K)
    busy_s_total: float  # wall seconds of computing since start
    behind_s_total: float  # wall seconds idle with work waiting since start
    steps_total: int

    def to_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class CardClock:
    def __init__(self, time_scale: float, now: float) -> None:
        if not time_scale > 0:
            raise ValueError("the time scale must be positive")
        self.time_scale = time_scale
        self._free_at = now
        self._busy = self._behind = self._simulated = 0.0
        self._steps = 0
        self._mark = now
        self._mark_busy = self._mark_behind = 0.0
        self._mark_steps = 0

    def submit(self, simulated_s: float, now: float, continuing: bool) -> float:
        """Hand a step of `simulated_s` to the card at wall time `now`; return when it ends.

        `continuing`: the step carries on requests the previous step ran, so an idle gap
        before it is the host falling behind, not a pause in the load.
        """
        start = max(now, self._free_at)
        if continuing and now > self._free_at:
            self._behind += now - self._free_at
        wall = simulated_s * self.time_scale
        self._free_at = start + wall
        self._busy += wall
        self._simulated += simulated_s
        self._steps += 1
        return self._free_at

    def status(self, now: float) -> CardStatus:
        """The interval since the last call, closing it."""
        interval = max(now - self._mark, 1e-9)
        # work handed over but not yet done belongs to later intervals
        pending = max(0.0, self._free_at - now)
        busy = min(interval, max(0.0, self._busy - pending - self._mark_busy))
        out = CardStatus(
            time_scale=self.time_scale,
            interval_s=interval,
            busy_share=busy / interval,
            behind_share=min(1.0, (self._behind - self._mark_behind) / interval),
            steps=self._steps - self._mark_steps,
            simulated_s_total=self._simulated,
            busy_s_total=self._busy - pending,
            behind_s_total=self._behind,
            steps_total=self._steps,
        )
        self._mark, self._mark_busy = now, self._mark_busy + busy
        self._mark_behind, self._mark_steps = self._behind, self._steps
        return out
