"""Bounded history of one engine's observations, with counter arithmetic that survives restarts.

Counter increases follow Prometheus' rule: a drop means the counter was reset (vLLM restarted), so
the increase across the drop is the new value itself, never a negative or a huge fake jump. This
module holds that rule and the counter list; everything else asks the timeline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvwatch.sidecar.metrics.observe import EngineObservation

__all__ = ["COUNTERS", "MAX_RATE_PER_S", "Timeline", "counter_increase"]

COUNTERS = (
    "preemptions_total",
    "preemptions_kv_full_total",
    "preemptions_priority_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "finished_requests_total",
    "repeat_preempted_total",
    "prompt_tokens_computed_total",
    "prompt_tokens_cached_total",
    "offload_load_bytes_total",
    "offload_store_bytes_total",
    "offload_allocation_failures_total",
    "admission_rejections_total",
)
# Faster than any server counts (one engine: ~1e5 tokens/s of prefill on the biggest GPUs): a
# point whose counter rose faster since the last one is a broken exporter, not load.
MAX_RATE_PER_S = {
    "preemptions_total": 1e5,
    "preemptions_kv_full_total": 1e5,
    "preemptions_priority_total": 1e5,
    "prompt_tokens_total": 1e9,
    "generation_tokens_total": 1e9,
    "finished_requests_total": 1e6,
    "repeat_preempted_total": 1e6,
    "prompt_tokens_computed_total": 1e9,
    "prompt_tokens_cached_total": 1e9,
    "offload_load_bytes_total": 1e13,  # past any host link (PCIe 6 x16 is 1.3e11 B/s)
    "offload_store_bytes_total": 1e13,
    "offload_allocation_failures_total": 1e7,
    "admission_rejections_total": 1e7,
}


@dataclass
class Timeline:
    """Points are (monotonic seconds, observation). `max_points` bounds memory."""

    max_points: int = 900
    points: deque[tuple[float, EngineObservation]] = field(init=False)
    # Reset-corrected increase of each counter since this timeline began: monotonic by construction.
    observed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    resets: int = 0
    _last: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.points = deque(maxlen=self.max_points)

    def add(self, t: float, obs: EngineObservation) -> dict[str, float] | None:
        """Append a point; returns each counter's reset-corrected increase since the last one.

        None when a counter rose implausibly fast for the time between (a broken exporter):
        that increase is counted nowhere, and the history before it is dropped, so no window
        spans the jump; the point starts the history afresh and watching goes on."""
        step = dict.fromkeys(COUNTERS, 0.0)
        reset = False
        now = {n: v for n in COUNTERS if (v := getattr(obs, n)) is not None}
        for name, b in now.items():
            last = self._last.get(name)  # the last point that had it (a scrape may lack it)
            if last is None:
                continue
            t0, a = last
            reset |= b < a
            step[name] = counter_increase(a, b)
            if step[name] > MAX_RATE_PER_S[name] * max(t - t0, 1e-3):
                self.points.clear()
                self.points.append((t, obs))
                self._last = {n: (t, v) for n, v in now.items()}
                return None
        for name, inc in step.items():
            self.observed[name] += inc
        self.resets += reset
        self.points.append((t, obs))
        self._last.update((n, (t, v)) for n, v in now.items())
        return step

    @property
    def latest(self) -> tuple[float, EngineObservation] | None:
        return self.points[-1] if self.points else None

    def window(self, window_s: float, now: float) -> list[tuple[float, EngineObservation]]:
        """The points of the last `window_s` seconds, oldest first."""
        start = now - window_s
        out = []
        for p in reversed(self.points):
            if p[0] < start:
                break
            out.append(p)
        out.reverse()
        return out

    def peak(self, name: str, window_s: float, now: float) -> float | None:
        """Largest value of a gauge field inside the window."""
        vals = [v for _, o in self.window(window_s, now) if (v := getattr(o, name)) is not None]
        return max(vals, default=None)

    def stalled_s(self, now: float) -> float:
        """How long requests have been running or waiting while no token was generated: the
        span back to the oldest point of the current run of points that all hold work and
        the latest generation count. 0 when the latest point holds no work."""
        if not self.points:
            return 0.0
        last = self.points[-1][1]
        count = last.generation_tokens_total
        since = None
        for t, o in reversed(self.points):
            work = (o.running or 0.0) + (o.waiting or 0.0)
            if work < 1 or o.generation_tokens_total != count:
                break
            since = t
        return 0.0 if since is None else max(0.0, now - since)

    def peak_demand(self, window_s: float, now: float) -> float | None:
        """Most requests the server held at once (running + waiting) inside the window."""
        vals = [
            o.running + (o.waiting or 0.0)
            for _, o in self.window(window_s, now)
            if o.running is not None
        ]
        return max(vals, default=None)

    def increase(self, counter: str, window_s: float, now: float) -> float | None:
        """Reset-corrected increase over the points inside the window; None with fewer than 2."""
        pts = [(t, getattr(o, counter)) for t, o in self.window(window_s, now)]
        pts = [(t, v) for t, v in pts if v is not None]
        if len(pts) < 2:
            return None
        return sum(counter_increase(a[1], b[1]) for a, b in zip(pts, pts[1:], strict=False))

    def rate(self, counter: str, window_s: float, now: float) -> float | None:
        """Per-second rate over the window, from the points it holds."""
        pts = [t for t, o in self.window(window_s, now) if getattr(o, counter) is not None]
        inc = self.increase(counter, window_s, now)
        if inc is None or pts[-1] <= pts[0]:
            return None
        return inc / (pts[-1] - pts[0])

    def interval_rates(self, counter: str, window_s: float, now: float) -> list[float]:
        """The counter's per-second rate between each pair of successive points that ends
        inside the window (for a recent peak rate)."""
        out = []
        pts = list(self.points)
        for (t0, a), (t1, b) in zip(pts, pts[1:], strict=False):
            if t1 < now - window_s or t1 <= t0:
                continue
            x, y = getattr(a, counter), getattr(b, counter)
            if x is not None and y is not None:
                out.append(counter_increase(x, y) / (t1 - t0))
        return out


def counter_increase(a: float, b: float) -> float:
    """From a to b: a drop is a reset, after which the counter counted b from zero."""
    return b - a if b >= a else b
