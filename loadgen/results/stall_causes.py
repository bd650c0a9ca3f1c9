"""Which of the client's stalls happened while the server preempted.

vLLM never says which request it preempted, and its counter (`vllm:num_preemptions_total`) rises
when a victim next produces output: when the victim's stall ends. So a stall counts as
preempting when the server's counter rose between the last sample taken before the stream
stopped and the first sample taken `lag_s` or more after it resumed (the update may trail the
token a little). Samples are the run's timeline (once a second) with the snapshots before and
after the run at its ends.

This is coincidence, not proof: in a stretch where the server preempts, a stall of another
cause counts too. The useful reading is the other way round: a stall with no preemption around
it had another cause (a wave of prefills batched beside the stream, a busy host, the network).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from kvwatch.sidecar.judge.timeline import counter_increase

__all__ = ["PreemptionCounter", "mark_preempting_stalls"]


class PreemptionCounter:
    """The server's preemption counter as sampled: (unix time, value) in time order."""

    def __init__(self, samples: Sequence[tuple[float, float]]) -> None:
        pts = sorted(samples)
        self.times = [t for t, _ in pts]
        self.values = [v for _, v in pts]

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]]) -> PreemptionCounter:
        """From timeline rows (`t`, `preemptions_total`); rows without the counter are skipped."""
        return cls(
            [
                (float(r["t"]), float(r["preemptions_total"]))
                for r in rows
                if r.get("t") is not None and r.get("preemptions_total") is not None
            ]
        )

    def rose(self, start: float, end: float, lag_s: float = 0.0) -> bool | None:
        """Whether it rose anywhere from the last sample at or before `start` to the first at
        or after `end + lag_s` (or the last sample, if that is after `end`: the snapshot after
        a run sees every update); None when no samples bracket the span. A restart resets the
        counter, so a drop counts as a rise when the new value is above 0."""
        i = bisect.bisect_right(self.times, start) - 1
        j = bisect.bisect_left(self.times, end + lag_s)
        if j == len(self.times) and self.times and self.times[-1] >= end:
            j -= 1
        if i < 0 or j >= len(self.times):
            return None
        v = self.values[i : j + 1]
        return any(counter_increase(a, b) > 0 for a, b in zip(v, v[1:], strict=False))


def mark_preempting_stalls(
    records: list[dict[str, Any]],
    counter: PreemptionCounter,
    start_unix: float,
    lag_s: float = 0.2,
) -> None:
    """Set each record's `stalls_preempting`: how many of its stalls (`stall_spans`, seconds
    from `start_unix`) saw the counter rise; None when one of them has no samples around it."""
    for r in records:
        judged = [
            counter.rose(start_unix + s, start_unix + e, lag_s)
            for s, e in r.get("stall_spans") or []
        ]
        r["stalls_preempting"] = None if None in judged else sum(1 for j in judged if j)
