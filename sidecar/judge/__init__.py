"""The judge, pure: one engine's observations become a timeline (counter arithmetic that
survives restarts), signals (headroom, rates, the forecast of when the cache runs out),
evidence, a state (ok / pressure / saturated / thrashing, with hysteresis) and thrashing
episodes; liveness tells a dead engine from a down target. `pipeline` runs that chain once per
scrape. No I/O and no clock of its own: the caller passes the time, so a recorded run replays
exactly. Reads the sources' typed values, the contract and kvwatch.sizing."""

from __future__ import annotations

__all__: list[str] = []
