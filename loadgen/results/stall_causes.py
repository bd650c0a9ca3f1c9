"""Why each of the client's stalls happened: whether the server preempted around it, and one
cause per stall read from what the server and the other streams did meanwhile.

vLLM never says which request it preempted, and its counter (`vllm:num_preemptions_total`) rises
with the victim's next output: under vLLM 0.32's async scheduling that is the token it had in
flight when it was preempted, at the start of its stall (on the twin the counter rose in the
second of the step that preempted, 182 times of 182); without async scheduling, when it
resumes. So a stall counts as preempting when the server's counter rose anywhere between the
last sample taken before the stream stopped and the first sample taken `lag_s` or more after
it resumed (the update may trail the token a little). Samples are the run's timeline (once a
second) with the snapshots before and after the run at its ends.

This is coincidence, not proof: in a stretch where the server preempts, a stall of another
cause counts too. The useful reading is the other way round: a stall with no preemption around
it had another cause (a wave of prefills batched beside the stream, a busy host, the network).

`attribute_stalls` names one cause per stall (CAUSES). What tells them apart is whether the
stream stalled alone: vLLM schedules every running request in every step, so a long step (a
prefill or a recompute batched in) or a host that stopped reading stalls every stream at once,
while a request that was preempted, or left out of the steps, stops alone as the others go on.
- stalled alone, the preemption counter rose around it: `preempted` (the victim);
- alone, no preemption: `queue` (the server ran the others and not it);
- with the others, the counter rose: `recompute` (behind a victim's recompute: vLLM counts a
  preemption when the victim runs again, in the step that recomputes it);
- with the others, prompt tokens computed meanwhile: `prefill` (prefill interference);
- with the others, neither, while the server held requests that were not this run's (its
  running and waiting requests beyond this run's in flight, at every sample around the stall):
  `prefill` (another client's prompts: a prompt prefilled in chunks is counted only with its
  last chunk, so its earlier chunks' stalls show in no counter);
- with the others, none of these: `host` (the server decoded nothing new: the API server or
  this client was behind);
- no other stream in flight to compare with (the last turns of a session load): `preempted`
  where the counter rose, else `prefill` where prompt tokens were computed, else `unknown`;
- no server samples around it: `unknown`.
Held to the twin's step trace, which knows each step's composition: bench/bench_stall_causes.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, TypeGuard

from kvwatch.sidecar.judge.timeline import counter_increase

__all__ = ["CAUSES", "SampledCounter", "ServerCounters", "attribute_stalls",
           "mark_preempting_stalls", "token_times"]  # fmt: skip

CAUSES = ("preempted", "recompute", "prefill", "queue", "host", "unknown")
# a stream with two tokens in the middle 80% of the stall went on while this one stopped: the
# engine ran steps without it (one long step gives every stream one token, at its end)
_EDGE = 0.1
# share of the other streams in flight that went on: the stall was this one's (victims are
# preempted several at once and wait together, so the ones that go on can be a minority)
_ALONE = 0.1


class SampledCounter:
    """One of the server's counters as sampled (preemptions; prompt tokens computed): (unix
    time, value) in time order."""

    def __init__(self, samples: Sequence[tuple[float, float]]) -> None:
        pts = sorted(samples)
        self.times = [t for t, _ in pts]
        self.values = [v for _, v in pts]

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]]) -> SampledCounter:
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
        got = self.increase(start, end, lag_s)
        return None if got is None else got[0] > 0

    def bracket(self, start: float, end: float, lag_s: float = 0.0) -> tuple[int, int] | None:
        """The first and last index of the samples `rose` reads; None when none bracket it."""
        i = bisect.bisect_right(self.times, start) - 1
        j = bisect.bisect_left(self.times, end + lag_s)
        if j == len(self.times) and self.times and self.times[-1] >= end:
            j -= 1
        if i < 0 or j >= len(self.times):
            return None
        return i, j

    def increase(
        self, start: float, end: float, lag_s: float = 0.0
    ) -> tuple[float, float, float] | None:
        """How much it rose over the samples `rose` reads, and their first and last times."""
        got = self.bracket(start, end, lag_s)
        if got is None:
            return None
        i, j = got
        v = self.values[i : j + 1]
        rise = sum(counter_increase(a, b) for a, b in zip(v, v[1:], strict=False))
        return rise, self.times[i], self.times[j]


def mark_preempting_stalls(
    records: list[dict[str, Any]],
    counter: SampledCounter,
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


class ServerCounters:
    """The server's counters a cause is read from, sampled: preemptions and prompt tokens
    computed (`vllm:prompt_tokens_by_source{source="local_compute"}`, else all prompt tokens),
    and the requests it held (running and waiting)."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self.preemptions = SampledCounter.from_rows(rows)
        prompt, held = [], []
        for r in rows:
            v = r.get("prompt_tokens_computed_total")
            if v is None:
                v = r.get("prompt_tokens_total")
            t = r.get("t")
            if not isinstance(t, int | float):
                continue
            if isinstance(v, int | float):
                prompt.append((float(t), float(v)))
            running, waiting = r.get("running"), r.get("waiting")
            if _finite(running) and _finite(waiting):
                held.append((float(t), float(running) + float(waiting)))
        self.prompt = SampledCounter(prompt)
        self.held = SampledCounter(held)  # a gauge: read sample by sample, not as a rise

    def held_at(self, start: float, end: float, lag_s: float) -> list[tuple[float, float]]:
        """The (time, requests held) samples `SampledCounter.rose` would read for the span."""
        h = self.held
        got = h.bracket(start, end, lag_s)
        if got is None:
            return []
        i, j = got
        return list(zip(h.times[i : j + 1], h.values[i : j + 1], strict=True))


def _finite(x: object) -> TypeGuard[int | float]:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def token_times(record: dict[str, Any]) -> list[float]:
    """A record's token arrival times (seconds from the run's start), from its first token
    and its gaps."""
    t = record.get("first_token_at")
    if not isinstance(t, int | float):
        return []
    out = [float(t)]
    for g in record.get("gaps") or []:
        out.append(out[-1] + float(g))
    return out


def attribute_stalls(
    records: list[dict[str, Any]],
    counters: ServerCounters,
    start_unix: float,
    lag_s: float = 0.2,
) -> None:
    """Set each record's `stall_causes`: one of CAUSES per stall of `stall_spans`, in order
    (the module's docstring says how each is told)."""
    streams = [(r, token_times(r)) for r in records if r.get("first_token_at") is not None]
    in_flight = _InFlight([times for _, times in streams])
    own = _OwnInFlight(records)
    judged: list[tuple[dict[str, Any], int, float, float, str]] = []
    for r in records:
        r["stall_causes"] = []
        for k, (s, e) in enumerate(r.get("stall_spans") or []):
            cause = _alone_or_not(r, s, e, streams, in_flight, counters, start_unix, lag_s)
            r["stall_causes"].append(cause)
            judged.append((r, k, s, e, cause))
    # a victim is recomputed in the step that ends its stall: its context then, by the time
    # the client saw it resume; new prompts are computed in the step of their first token
    recomputed = sorted(
        (e, _context_at(r, s)) for r, _, s, e, cause in judged if cause == "preempted"
    )
    prefilled = sorted(
        (float(r["first_token_at"]), float(r.get("prompt_tokens") or 0)) for r, _ in streams
    )
    for r, k, s, e, cause in judged:
        if cause != _TOGETHER:
            continue
        recompute = _tokens_in(recomputed, s, e + _SAME_STEP_S)
        prefill = _tokens_in(prefilled, s, e + _SAME_STEP_S)
        prefill += _others_prompts(counters, prefilled, s, e, start_unix, lag_s)
        if recompute or prefill:
            r["stall_causes"][k] = "recompute" if recompute >= prefill else "prefill"
        elif counters.preemptions.rose(start_unix + s, start_unix + e, lag_s):
            r["stall_causes"][k] = "recompute"  # another client's request was the victim
        elif counters.prompt.rose(start_unix + s, start_unix + e, lag_s):
            r["stall_causes"][k] = "prefill"  # another client's prompts
        elif _others_held(counters, own, s, e, start_unix, lag_s):
            r["stall_causes"][k] = "prefill"  # another client's prompts, in chunks
        else:
            r["stall_causes"][k] = "host"


class _OwnInFlight:
    """How many of this run's requests were sent and not yet finished, at any moment."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        def at(key: str) -> list[float]:
            return sorted(float(v) for r in records if isinstance(v := r.get(key), int | float))

        self.sent, self.done = at("sent_at"), at("finished_at")

    def at(self, t: float) -> int:
        return bisect.bisect_right(self.sent, t) - bisect.bisect_right(self.done, t)


def _others_held(
    counters: ServerCounters,
    own: _OwnInFlight,
    s: float,
    e: float,
    start_unix: float,
    lag_s: float,
) -> bool:
    """Whether the server held requests that were not this run's at every sample around the
    stall (its running and waiting beyond this run's in flight)."""
    held = counters.held_at(start_unix + s, start_unix + e, lag_s)
    return bool(held) and all(n - own.at(t - start_unix) >= 1 for t, n in held)


def _others_prompts(
    counters: ServerCounters,
    prefilled: list[tuple[float, float]],
    s: float,
    e: float,
    start_unix: float,
    lag_s: float,
) -> float:
    """Prompt tokens the server computed for other clients during the stall: what its counter
    rose by over the samples around it beyond this run's own prompts, spread evenly over
    those samples' span (they are a second apart; the stall is a part of it)."""
    got = counters.prompt.increase(start_unix + s, start_unix + e, lag_s)
    if got is None:
        return 0.0
    rise, t0, t1 = got
    own = _tokens_in(prefilled, t0 - start_unix, t1 - start_unix)
    return max(0.0, rise - own) * (e - s) / max(t1 - t0, e - s)


_TOGETHER = "together"  # stalled with the others: the step's composition decides
_SAME_STEP_S = 0.05  # tokens of one step reach the client this far apart at most


def _context_at(record: dict[str, Any], s: float) -> float:
    """The tokens a request held when its stream stopped at `s`: its prompt and what it had
    generated."""
    made = sum(1 for t in token_times(record) if t <= s + 1e-9)
    return float(record.get("prompt_tokens") or 0) + made


def _tokens_in(points: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The tokens of the (time, tokens) points with time in (lo, hi]."""
    i = bisect.bisect_right(points, (lo, math.inf))
    j = bisect.bisect_right(points, (hi, math.inf))
    return sum(n for _, n in points[i:j])


class _InFlight:
    """Which streams were streaming at a moment, by the second: a stall is compared with the
    streams in flight around it, not with every request of the run (a run at H100 scale has
    tens of thousands of stalls and of requests)."""

    def __init__(self, streams: list[list[float]]) -> None:
        self._at: dict[int, list[int]] = {}
        for i, times in enumerate(streams):
            if len(times) >= 2:
                for second in range(math.floor(times[0]), math.floor(times[-1]) + 1):
                    self._at.setdefault(second, []).append(i)

    def at(self, t: float) -> list[int]:
        """The streams whose first and last tokens may bracket `t` (a superset)."""
        return self._at.get(math.floor(t), [])


def _alone_or_not(
    record: dict[str, Any],
    s: float,
    e: float,
    streams: list[tuple[dict[str, Any], list[float]]],
    index: _InFlight,
    counters: ServerCounters,
    start_unix: float,
    lag_s: float,
) -> str:
    """`preempted`, `queue` or `unknown`, or `_TOGETHER` for the second pass."""
    edge = _EDGE * (e - s)
    lo, hi = s + edge, e - edge
    flowing = in_flight = 0
    for j in index.at(lo):
        o, times = streams[j]
        if o is record or times[0] > lo or times[-1] < hi:
            continue
        in_flight += 1
        i = bisect.bisect_right(times, lo)
        flowing += i + 1 < len(times) and times[i + 1] < hi
    preempted = counters.preemptions.rose(start_unix + s, start_unix + e, lag_s)
    if preempted is None:
        return "unknown"
    if not in_flight:  # no other stream to compare with: what the server's counters say
        if preempted:
            return "preempted"
        prompts = counters.prompt.rose(start_unix + s, start_unix + e, lag_s)
        return "prefill" if prompts else "unknown"
    if flowing / in_flight >= _ALONE:
        return "preempted" if preempted else "queue"
    return _TOGETHER
