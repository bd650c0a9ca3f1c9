"""Capacity search: the highest load that meets the SLOs, and the load where preemption starts.

Pure: the caller runs each probe and records what it saw; the search says which load to probe
next. Bracketing doubles the load from the start until a load fails the SLOs (or the maximum is
reached, or halves it while even the start fails); bisection then narrows the highest passing and
the lowest failing load to the precision (concurrency: to neighbours). Each load is probed
`repeats` times and judged on every request of its probes pooled; while the 95% Wilson interval
of that attainment still straddles the target, it is probed again, up to `max_repeats` times.

The KV onset is the lowest load whose probes preempted; the same probes bracket it, and it is
bisected the same way once the SLO limit is found. The limit that binds: a cache that had run
out by the load that failed the SLOs (preempting, or queueing requests it had no room for) means
the KV cache; SLOs failing on a cache with room means compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "BY", "ProbeResult", "LoadVerdict", "SearchPlan", "CapacitySearch", "SearchResult", "wilson",
]  # fmt: skip

BY = ("concurrency", "rate")
_Z95 = 1.959964


def wilson(k: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n (95% by default); (0, 1) when n is 0.
    Unlike the normal approximation it stays inside [0, 1] and is honest at 0/n and n/n."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


@dataclass(frozen=True)
class ProbeResult:
    """One probe at one load: how many requests it sent, how many met every SLO (a failed
    request meets none), and the preemptions the server counted while it ran."""

    load: float
    requests: int
    attained: int
    preemptions: float | None  # None: neither the server nor a sidecar said
    duration_s: float
    name: str = ""
    # the cache ran out: it preempted, or requests waited while it had no room for a prompt
    # (vLLM admits a request only when its prompt's blocks fit, so a cache can bind by queueing
    # alone); None when the server's timeline could not tell
    kv_ran_out: bool | None = None


@dataclass(frozen=True)
class LoadVerdict:
    """Every probe at one load, pooled."""

    load: float
    probes: tuple[ProbeResult, ...]

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.probes)

    @property
    def attained(self) -> int:
        return sum(p.attained for p in self.probes)

    @property
    def attainment(self) -> float:
        return self.attained / self.requests if self.requests else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.attained, self.requests)

    @property
    def preemptions(self) -> float | None:
        known = [p.preemptions for p in self.probes if p.preemptions is not None]
        return sum(known) if known else None

    @property
    def preemptions_per_s(self) -> float | None:
        seconds = sum(p.duration_s for p in self.probes)
        n = self.preemptions
        return None if n is None or seconds <= 0 else n / seconds

    @property
    def preempted(self) -> bool:
        return (self.preemptions or 0.0) > 0

    @property
    def ran_out(self) -> bool:
        return self.preempted or any(p.kv_ran_out for p in self.probes)

    def meets(self, target: float) -> bool:
        return self.requests > 0 and self.attainment >= target

    def decided(self, target: float) -> bool:
        """The 95% interval lies wholly on one side of the target."""
        lo, hi = self.interval
        return lo >= target or hi < target


@dataclass(frozen=True)
class SearchPlan:
    by: str  # "concurrency" or "rate" (requests per second)
    target: float = 0.95  # the share of requests that must meet every SLO
    start: float = 1.0
    max_load: float = 256.0
    min_load: float = 0.01  # rate only: halving stops here
    precision: float = 0.1  # rate only: stop when the bracket is this fraction of its top
    repeats: int = 2
    max_repeats: int = 4

    def __post_init__(self) -> None:
        if self.by not in BY:
            raise ValueError(f"search by one of {', '.join(BY)}, not {self.by!r}")
        if not 0 < self.target <= 1:
            raise ValueError(f"the attainment target must be in (0, 1], not {self.target:g}")
        if not 0 < self.start <= self.max_load:
            raise ValueError(f"the start {self.start:g} must be positive and at most the maximum")
        if self.by == "concurrency" and (self.start != int(self.start) or self.start < 1):
            raise ValueError(f"a concurrency starts at a whole number, not {self.start:g}")
        if not 0 < self.precision < 1:
            raise ValueError(f"the precision must be in (0, 1), not {self.precision:g}")
        if not 1 <= self.repeats <= self.max_repeats:
            raise ValueError("repeats must be at least 1 and at most max_repeats")


@dataclass(frozen=True)
class SearchResult:
    by: str
    target: float
    verdicts: tuple[LoadVerdict, ...]
    max_ok: LoadVerdict | None  # the highest load meeting the SLOs below the lowest failing one
    min_fail: LoadVerdict | None  # the lowest load failing them; None: none up to the maximum
    onset: LoadVerdict | None  # the lowest load that preempted; None: none did
    clean: LoadVerdict | None  # the highest load below the onset that did not preempt
    ran_out: LoadVerdict | None = None  # the lowest load whose cache ran out (preempt or queue)

    @property
    def binding(self) -> str | None:
        """ "kv cache" when the cache had run out (preempting, or queueing requests it had no
        room for) by the lowest failing load; "compute" when the SLOs failed on a cache that
        still had room; None when no load failed."""
        if self.min_fail is None:
            return None
        if self.ran_out is not None and self.ran_out.load <= self.min_fail.load:
            return "kv cache"
        return "compute"


@dataclass
class CapacitySearch:
    plan: SearchPlan
    probes: list[ProbeResult] = field(default_factory=list)

    def record(self, probe: ProbeResult) -> None:
        self.probes.append(probe)

    def verdicts(self) -> list[LoadVerdict]:
        by_load: dict[float, list[ProbeResult]] = {}
        for p in self.probes:
            by_load.setdefault(p.load, []).append(p)
        return [LoadVerdict(load, tuple(ps)) for load, ps in sorted(by_load.items())]

    def _round(self, load: float) -> float:
        if self.plan.by == "concurrency":
            return float(max(1, round(load)))
        return float(f"{load:.3g}")

    def _narrow(self, lo: float, hi: float) -> bool:
        if self.plan.by == "concurrency":
            return hi - lo <= 1
        return hi - lo <= self.plan.precision * hi

    def _between(self, lo: float, hi: float) -> float | None:
        """A new load between two probed ones, or None when they are close enough."""
        if self._narrow(lo, hi):
            return None
        mid = self._round((lo + hi) / 2)
        return mid if lo < mid < hi else None

    def next_load(self) -> float | None:
        """The load to probe next; None when the search is done."""
        plan = self.plan
        vs = self.verdicts()
        if not vs:
            return self._round(plan.start)
        last = self.probes[-1].load
        current = next(v for v in vs if v.load == last)
        n = len(current.probes)
        if n < plan.repeats or (n < plan.max_repeats and not current.decided(plan.target)):
            return last
        r = self.result()
        # bracket the SLO limit
        if r.min_fail is None:
            top = vs[-1].load
            if top >= plan.max_load:
                return self._onset_step(r)
            return min(self._round(top * 2), plan.max_load)
        if r.max_ok is None:
            lower = self._lower(vs[0].load)
            return lower if lower is not None else self._onset_step(r)
        # bisect it
        mid = self._between(r.max_ok.load, r.min_fail.load)
        return mid if mid is not None else self._onset_step(r)

    def _lower(self, low: float) -> float | None:
        """Half the lowest load probed, or None at the floor."""
        lower = self._round(low / 2)
        if lower >= low or (self.plan.by == "rate" and lower < self.plan.min_load):
            return None
        return lower

    def _onset_step(self, r: SearchResult) -> float | None:
        """Narrow the KV onset once the SLO limit is known: between the highest clean load and
        the onset; lower first when even the lowest load probed preempted. No preemption at
        all leaves nothing to narrow."""
        if r.onset is None:
            return None
        if r.clean is None:
            return self._lower(r.verdicts[0].load) if r.onset is r.verdicts[0] else None
        return self._between(r.clean.load, r.onset.load)

    def result(self) -> SearchResult:
        vs = self.verdicts()
        t = self.plan.target
        fails = [v for v in vs if not v.meets(t)]
        min_fail = fails[0] if fails else None
        below = [v for v in vs if v.meets(t) and (min_fail is None or v.load < min_fail.load)]
        preempted = [v for v in vs if v.preempted]
        onset = preempted[0] if preempted else None
        clean = [
            v for v in vs
            if not v.preempted and v.preemptions is not None
            and (onset is None or v.load < onset.load)
        ]  # fmt: skip
        ran_out = [v for v in vs if v.ran_out]
        return SearchResult(
            self.plan.by,
            t,
            tuple(vs),
            below[-1] if below else None,
            min_fail,
            onset,
            clean[-1] if clean else None,
            ran_out[0] if ran_out else None,
        )
