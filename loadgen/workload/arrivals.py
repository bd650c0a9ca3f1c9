"""Arrival patterns: when each request is sent, as offsets from the start of its stage.

Each open-loop pattern is a small seeded class whose `offsets()` yields send times; the runner sends
against absolute deadlines (stage start + offset), never relative sleeps, so a slow send cannot
shift every later one. Fixed concurrency is closed-loop and has no schedule: N workers each send
their next request when the previous one ends.

| pattern | parameters | inter-arrival times |
|---|---|---|
| constant | rate | exactly 1/rate |
| poisson | rate | exponential, mean 1/rate |
| gamma | rate, burstiness | gamma(shape=burstiness, mean 1/rate); 1 = Poisson, < 1 burstier |
| ramp | start, end (rates), poisson (0/1) | the rate grows linearly; sends spaced by its integral |
| burst | size, every (seconds) | `size` at once, every `every` seconds (traffic spikes) |
| replay | a trace's send times | as recorded (`--trace`: loadgen/workload/trace.py) |
| concurrency | n | closed loop, n in flight |
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "Constant", "Poisson", "Gamma", "Ramp", "Burst", "Replay", "Concurrency", "Pattern",
    "OpenPattern", "describe",
]  # fmt: skip


def _positive(name: str, value: float) -> None:
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class Constant:
    rate: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate)

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        k = 0
        while (t := k / self.rate) < duration_s:  # k / rate: no drift from summing 1 / rate
            yield t
            k += 1


@dataclass(frozen=True)
class Poisson:
    rate: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate)

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        t = rng.expovariate(self.rate)
        while t < duration_s:
            yield t
            t += rng.expovariate(self.rate)


@dataclass(frozen=True)
class Gamma:
    rate: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        _positive("rate", self.rate)
        _positive("burstiness", self.burstiness)

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        shape, scale = self.burstiness, 1.0 / (self.rate * self.burstiness)
        t = rng.gammavariate(shape, scale)
        while t < duration_s:
            yield t
            t += rng.gammavariate(shape, scale)


@dataclass(frozen=True)
class Ramp:
    """Evenly spaced sends (the default) measure a server's response to the rate alone; real
    traffic comes as a Poisson process, whose clusters run a cache out earlier and at random
    (`poisson=1`: Poisson arrivals at the ramp's rate), or burstier still (`burstiness=B`:
    gamma gaps of shape B at the ramp's rate, as `gamma` sends them; B = 0.25 has a gap's
    coefficient of variation 2)."""

    start: float
    end: float
    poisson: int = 0
    burstiness: float | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < 0 or self.start == self.end == 0:
            raise ValueError(
                f"ramp rates must be >= 0 and not both 0, got {self.start}, {self.end}"
            )
        if self.poisson not in (0, 1):
            raise ValueError(f"poisson must be 0 or 1, got {self.poisson}")
        if self.burstiness is not None:
            _positive("burstiness", self.burstiness)

    def _gap(self, rng: random.Random) -> float:
        """The next arrival's gap in the ramp's own time (the rate's integral: mean 1)."""
        if self.burstiness is not None:
            return rng.gammavariate(self.burstiness, 1.0 / self.burstiness)
        return rng.expovariate(1.0) if self.poisson else 1.0

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        # The k-th send is where the cumulative rate r0*t + (r1-r0)*t^2/(2D) reaches k: evenly,
        # or (time rescaling) where it reaches the k-th arrival of a Poisson (or gamma renewal)
        # process of rate 1.
        r0, slope = self.start, (self.end - self.start) / duration_s
        k = self._gap(rng) if self.poisson or self.burstiness is not None else 0.0
        while True:
            if slope == 0:
                t = k / r0
            else:
                disc = r0 * r0 + 2 * slope * k
                if disc < 0:
                    return
                t = (-r0 + math.sqrt(disc)) / slope
            if t >= duration_s:
                return
            yield t
            k += self._gap(rng)


@dataclass(frozen=True)
class Burst:
    """Spikes: the load that a cache sized for the average cannot hold, on a server with compute
    to spare between them."""

    size: int
    every: float

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"burst size must be at least 1, got {self.size}")
        _positive("every", self.every)

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        k = 0
        while (t := k * self.every) < duration_s:
            for _ in range(self.size):
                yield t
            k += 1


@dataclass(frozen=True, repr=False)
class Replay:
    """A recorded trace's send times (seconds from the replay's start, in order)."""

    times: tuple[float, ...]

    def __repr__(self) -> str:  # the spec names it; the times are the trace's
        return f"Replay(requests={len(self.times)}, last={self.times[-1]:.3f}s)"

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("a replay needs at least one send time")
        if any(not (0 <= t < math.inf) for t in self.times) or any(
            b < a for a, b in zip(self.times, self.times[1:], strict=False)
        ):
            raise ValueError("a replay's send times must be finite, from 0, in order")

    def offsets(self, rng: random.Random, duration_s: float) -> Iterator[float]:
        for t in self.times:
            if t >= duration_s:
                return
            yield t


@dataclass(frozen=True)
class Concurrency:
    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.n}")


OpenPattern = Constant | Poisson | Gamma | Ramp | Burst | Replay
Pattern = OpenPattern | Concurrency


def describe(pattern: Pattern) -> str:
    """The pattern in a user's words, for a report's tables and chart marks."""
    match pattern:
        case Concurrency(n=n):
            return f"{n} stream{'s' if n != 1 else ''}"
        case Constant(rate=r):
            return f"{r:g} req/s, even"
        case Poisson(rate=r):
            return f"{r:g} req/s, Poisson"
        case Gamma(rate=r, burstiness=b):
            return f"{r:g} req/s, bursty ({b:g})"
        case Ramp(start=a, end=b, poisson=poisson, burstiness=burst):
            how = f", bursty ({burst:g})" if burst is not None else ", Poisson" if poisson else ""
            return f"{a:g}\u2192{b:g} req/s ramp{how}"
        case Burst(size=size, every=every):
            return f"{size} at once every {every:g} s"
        case Replay(times=times):
            return f"trace replay, {len(times)} request{'s' if len(times) != 1 else ''}"
