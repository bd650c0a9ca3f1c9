"""Judge each engine: ok, pressure, saturated or thrashing, with hysteresis so states do not flap.

Values come from sidecar/contract/thresholds.py:
- pressure: KV usage >= pressure_kv (left below pressure_exit_kv);
- saturated: the cache ran out in the short window (peak KV usage >= saturated_kv, or any
  preemption: vLLM preempts only when a running request cannot get a block, and on a short spike
  the sampled usage misses that moment), and requests waiting (now or within counter_lag_s: the
  preemption counter rises only when the victim runs again, by when the queue may be empty) or
  refused at vLLM's queue limits in the short window (--max-num-queued-reqs keeps the queue
  short by turning requests away, 0.32+);
- thrashing: saturated, a sustained preemption stream (rate and count in the short window), and
  evidence that work is redone: finished requests preempted 2+ times (per-request histogram),
  running requests collapsed below a fraction of their recent peak while others wait,
  generation throughput fell below a fraction of its recent peak, or the preemptions were a
  share of the requests that finished (the one that shows at H100 scale, where the batch and
  the throughput hardly move).

A worse state is entered once its conditions held `enter_after_s` (thrashing:
`thrashing_enter_after_s`); a state is left once its conditions stayed false for
`exit_after_s`. Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.signals import EngineSignals
from kvwatch.sidecar.judge.timeline import Timeline

__all__ = ["Evidence", "judge", "Detector", "gather_evidence", "policy_preemption_rate", "PRIORITY"]


@dataclass(frozen=True)
class Evidence:
    """What the judgement looked at, kept with it so every state can be explained."""

    kv_usage: float | None
    peak_kv_short: float | None
    waiting: float | None
    peak_waiting_recent: float | None  # over the counter's lag
    running: float | None
    peak_running_long: float | None
    preemptions_short: float | None
    preemption_rate_short: float | None
    repeat_preempted_long: float | None
    generation_rate: float | None
    peak_generation_rate_long: float | None
    # 0.32+ families; None where the server has none
    rejected_short: float | None = None  # admission rejections (queue limits)
    offload_failures_short: float | None = None  # stores the CPU offload tier had no room for
    finished_short: float | None = None  # requests finished in the short window
    # the server's scheduling policy (the log's non-default args, or the sidecar's flag), and
    # where it says why it preempted (num_preemptions_by_reason), the two causes apart
    scheduling_policy: str | None = None
    kv_full_preemptions_short: float | None = None
    kv_full_rate_short: float | None = None
    priority_preemptions_short: float | None = None
    priority_rate_short: float | None = None


def gather_evidence(
    tl: Timeline, sig: EngineSignals, now: float, th: Thresholds, policy: str | None = None
) -> Evidence:
    # generation rate per scrape interval over the long window, for its recent peak
    rates = tl.interval_rates("generation_tokens_total", th.long_window_s, now)
    return Evidence(
        kv_usage=sig.kv_usage,
        peak_kv_short=tl.peak("kv_usage", th.short_window_s, now),
        waiting=sig.waiting,
        peak_waiting_recent=tl.peak("waiting", th.counter_lag_s, now),
        running=sig.running,
        peak_running_long=tl.peak("running", th.long_window_s, now),
        preemptions_short=tl.increase("preemptions_total", th.short_window_s, now),
        preemption_rate_short=sig.preemptions_per_s_short,
        repeat_preempted_long=sig.repeat_preempted_long,
        generation_rate=sig.generation_tokens_per_s,
        peak_generation_rate_long=max(rates, default=None),
        rejected_short=tl.increase("admission_rejections_total", th.short_window_s, now),
        offload_failures_short=tl.increase(
            "offload_allocation_failures_total", th.short_window_s, now
        ),
        finished_short=tl.increase("finished_requests_total", th.short_window_s, now),
        scheduling_policy=policy,
        kv_full_preemptions_short=tl.increase("preemptions_kv_full_total", th.short_window_s, now),
        kv_full_rate_short=tl.rate("preemptions_kv_full_total", th.short_window_s, now),
        priority_preemptions_short=tl.increase(
            "preemptions_priority_total", th.short_window_s, now
        ),
        priority_rate_short=tl.rate("preemptions_priority_total", th.short_window_s, now),
    )


def judge(ev: Evidence, th: Thresholds, current: Level = Level.OK) -> tuple[Level, list[str]]:
    """The level the evidence supports right now (before hysteresis), and why. Preemption that
    is the priority policy at work (`_by_policy`) is judged pressure at most: reported, not
    paged."""
    reasons: list[str] = []
    kv = ev.kv_usage or 0.0
    peak = ev.peak_kv_short or kv
    waiting = max(ev.waiting or 0.0, ev.peak_waiting_recent or 0.0)
    rate = ev.preemption_rate_short or 0.0
    count = ev.preemptions_short or 0.0
    rejected = ev.rejected_short or 0.0
    ran_out = peak >= th.saturated_kv or count > 0
    saturated = ran_out and (waiting >= th.saturated_waiting or rejected > 0)
    context = _context(ev) + _gave_way(ev)
    if saturated and _by_policy(ev):
        return Level.PRESSURE, [*_as_policy(ev, rate, count, peak, waiting), *context]
    if ev.kv_full_preemptions_short is not None:  # only a request that found no block counts
        count, rate = ev.kv_full_preemptions_short, ev.kv_full_rate_short or 0.0
    stream = rate >= th.thrashing_preemptions_per_s and count >= th.thrashing_min_preemptions
    if saturated and stream:
        redone = _redone(ev, th, waiting, count)
        if redone:
            reasons.append(f"{rate:.1f} preemptions/s ({count:.0f} in the short window)")
            return Level.THRASHING, reasons + redone + context
    if saturated:
        full = (
            f"KV usage peaked at {peak:.0%}"
            if peak >= th.saturated_kv
            else f"{count:.0f} preemptions (the cache ran out; sampled KV peak {peak:.0%})"
        )
        queued = f"up to {waiting:.0f} waiting"
        if rejected > 0:
            queued += f", {rejected:.0f} refused at the queue limit"
        return Level.SATURATED, [f"{full} with {queued}", *context]
    limit = th.pressure_exit_kv if current >= Level.PRESSURE else th.pressure_kv
    if kv >= limit:
        return Level.PRESSURE, [f"KV usage {kv:.0%}"]
    return Level.OK, []


PRIORITY = "priority"  # vLLM's --scheduling-policy value that orders requests by class


def _by_policy(ev: Evidence) -> bool:
    """Whether the short window's preemptions were all the priority policy at work: vLLM says
    every one was a lower class giving way; or, where it does not say, the server runs the
    priority policy and preempted. vLLM up to 0.33 does not say which class a victim was in,
    and at H100 scale neither the batch nor the throughput tells (bench/bench_priority_policy.py
    saw the batch fall from 127 to 72 and the generation rate halve as the lower class gave
    way), so under that policy every preemption is taken for the policy's."""
    if ev.kv_full_preemptions_short is not None:
        return ev.kv_full_preemptions_short == 0 and (ev.priority_preemptions_short or 0) > 0
    return ev.scheduling_policy == PRIORITY and (ev.preemptions_short or 0) > 0


def _redone(ev: Evidence, th: Thresholds, waiting: float, count: float) -> list[str]:
    """The evidence that work is being redone."""
    out = []
    if (ev.repeat_preempted_long or 0) > 0:
        out.append(f"{ev.repeat_preempted_long:.0f} finished requests were preempted 2+ times")
    if (
        ev.peak_running_long
        and ev.running is not None
        and waiting >= 1
        and ev.running <= th.collapse_running_fraction * ev.peak_running_long
    ):
        out.append(
            f"running fell to {ev.running:.0f} from a peak of {ev.peak_running_long:.0f} "
            f"while {waiting:.0f} wait"
        )
    if (
        ev.peak_generation_rate_long
        and ev.generation_rate is not None
        and ev.generation_rate <= th.throughput_drop_fraction * ev.peak_generation_rate_long
    ):
        out.append(
            f"generation fell to {ev.generation_rate:.0f} tok/s from "
            f"{ev.peak_generation_rate_long:.0f}"
        )
    finished = ev.finished_short
    share = th.thrashing_preempted_share
    if share > 0 and finished is not None and count >= share * finished:
        out.append(
            f"{count:.0f} preempted against {finished:.0f} finished in the short window: "
            "each victim's context is computed again"
        )
    return out


def _as_policy(ev: Evidence, rate: float, count: float, peak: float, waiting: float) -> list[str]:
    """Why a full cache with preemptions under priority scheduling is not paged."""
    why = (
        "vLLM says every one was a lower-priority request giving way to a higher one"
        if ev.kv_full_preemptions_short is not None
        else "under --scheduling-policy priority the lowest-priority running requests give "
        "way first (this vLLM does not say which class it preempted: its "
        "num_preemptions_by_reason would)"
    )
    return [
        f"KV usage peaked at {peak:.0%} with up to {waiting:.0f} waiting",
        f"{rate:.1f} preemptions/s ({count:.0f} in the short window): {why}. The policy at "
        "work: reported (kvwatch_policy_preemptions_per_second), not paged as saturation or "
        "thrashing",
    ]


def _gave_way(ev: Evidence) -> list[str]:
    """Preemptions the server says were lower-priority requests giving way, beside others."""
    n = ev.priority_preemptions_short or 0
    if n <= 0 or not ev.kv_full_preemptions_short:
        return []
    return [
        f"{n:.0f} more preemptions in the short window were lower-priority requests giving "
        "way to higher ones (vLLM says so): the policy at work, not counted here"
    ]


def policy_preemption_rate(ev: Evidence) -> float:
    """Preemptions per second over the short window taken for the priority policy at work,
    not the cache running short: those vLLM says gave way, or, where it does not say, every
    one of a server under the priority policy."""
    if ev.kv_full_preemptions_short is not None:
        return ev.priority_rate_short or 0.0
    if ev.scheduling_policy == PRIORITY:
        return ev.preemption_rate_short or 0.0
    return 0.0


def _context(ev: Evidence) -> list[str]:
    """What the newer families add to a saturated or thrashing engine's reasons."""
    out = []
    if (ev.offload_failures_short or 0) > 0:
        out.append(
            f"{ev.offload_failures_short:.0f} stores found the CPU offload tier full "
            "(--kv-offloading-size too small)"
        )
    return out


@dataclass
class Detector:
    """One engine's state with hysteresis."""

    th: Thresholds
    level: Level = Level.OK
    reasons: list[str] = field(default_factory=list)
    since: float | None = None  # when the current level was entered
    _above: dict[Level, float | None] = field(default_factory=dict)
    _below: dict[Level, float | None] = field(default_factory=dict)

    def _hold(self, level: Level) -> float:
        if level is Level.THRASHING:
            return self.th.thrashing_enter_after_s
        return self.th.enter_after_s

    def update(self, now: float, raw: Level, reasons: list[str]) -> bool:
        """Feed one judgement; returns True if the level changed."""
        for lv in (Level.PRESSURE, Level.SATURATED, Level.THRASHING):
            if raw >= lv:
                if self._above.get(lv) is None:
                    self._above[lv] = now
                self._below[lv] = None
            else:
                self._above[lv] = None
                if self._below.get(lv) is None:
                    self._below[lv] = now
        held = [lv for lv, t in self._above.items() if t is not None and now - t >= self._hold(lv)]
        up = max(held, default=Level.OK)
        new = self.level
        if up > self.level:
            new = up
        elif self.level > Level.OK:
            gone = self._below.get(self.level)
            if gone is not None and now - gone >= self.th.exit_after_s:
                new = max(raw, up)
        if raw >= new:
            self.reasons = reasons
        if new != self.level:
            self.level, self.since = new, now
            return True
        return False
