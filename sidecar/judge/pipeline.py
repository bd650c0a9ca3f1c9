"""One engine's judging pipeline: observation -> timeline -> signals -> evidence -> detector ->
episode. Each value is computed once per scrape and kept for the views.

Pure: the caller passes both clocks (monotonic seconds for windows, unix seconds for what is
shown and stored) and persists what comes back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.detect import (
    Detector,
    gather_evidence,
    judge,
    policy_preemption_rate,
)
from kvwatch.sidecar.judge.episodes import Episode, EpisodeTracker
from kvwatch.sidecar.judge.prefix_cache import PrefixCacheView, prefix_cache_thrashing
from kvwatch.sidecar.judge.signals import EngineSignals, derive
from kvwatch.sidecar.judge.stall_seconds import StallTally
from kvwatch.sidecar.judge.timeline import COUNTERS, Timeline
from kvwatch.sidecar.metrics.observe import CacheConfig, EngineKey, EngineObservation
from kvwatch.sizing.archconfig import Architecture
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import layout_for_engine

__all__ = ["EngineJudge", "Transition", "Judged"]


@dataclass(frozen=True)
class Transition:
    """An engine moved from one state to another."""

    unix: float
    target: str
    model_name: str
    engine: str
    from_state: str
    to_state: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Judged:
    """What one scrape changed: a state transition, and the episode to persist (opened, grown
    or closed); None where nothing changed. `rejected`: the timeline refused the observation."""

    transition: Transition | None = None
    episode: Episode | None = None
    rejected: bool = False  # a counter jumped implausibly: its increase was left out
    histogram_refused: bool = False  # the ITL histogram could not be true: no stalls read


class EngineJudge:
    """One engine's history and judgement; `signals` are those of the last judged scrape."""

    def __init__(
        self,
        target: str,
        key: EngineKey,
        th: Thresholds,
        episodes_before: int,
        model: Architecture | None = None,
    ) -> None:
        self.target = target
        self.model = model
        self.model_error: str | None = None  # the model does not match the server's figures
        self._layout_for: CacheConfig | None = None
        self._growth: float | None = None
        self.key = key
        self.th = th
        self.timeline = Timeline()
        self.detector = Detector(th)
        self.episodes = EpisodeTracker(target, *key)
        self.episode_count = episodes_before
        self.signals: EngineSignals | None = None
        self.stalls = StallTally()  # stall seconds by cause, from the ITL histogram
        # since when (unix) the forecast has said the cache runs out within exhaustion_warn_s
        # while the engine is below saturated: KvwatchKvExhaustionImminent's condition
        self.exhaustion_imminent_since: float | None = None
        self._imminent_lapsed_at: float | None = None  # the forecast left the horizon then
        self._forecasts: deque[tuple[float, float | None]] = deque()  # (monotonic, seconds)
        # since when (unix) the prefix cache has lost its reusable prefixes, and why:
        # KvwatchPrefixCacheThrashing's condition (sidecar/judge/prefix_cache.py)
        self.prefix_thrashing_since: float | None = None
        self.prefix_reasons: tuple[str, ...] = ()
        self._prefix_lapsed_at: float | None = None

    def _growth_for(self, cache: CacheConfig | None) -> float | None:
        """Blocks a running request adds per step under the model's groups, once per cache
        configuration; a model that does not match the server leaves the plain estimate."""
        if self.model is None or cache is None or not cache.block_size or not cache.num_blocks:
            return None
        if cache != self._layout_for:
            self._layout_for = cache
            try:
                layout = layout_for_engine(
                    self.model,
                    cache.block_size,
                    cache.cache_dtype,
                    cache.num_blocks,
                    cache.kv_cache_memory_bytes,
                    cache.enable_prefix_caching,
                    cache.ssm_state_dtype,
                )
                self._growth, self.model_error = layout.steady_growth_per_step, None
            except SizingError as e:
                self._growth, self.model_error = None, str(e)
        return self._growth

    def _counting_down(self, now: float, left: float) -> bool:
        """A trend counts down: its forecast shrinks as the clock runs. A step in the load
        (idle, then busy and level) looks like a trend to a line through the window at first,
        but its forecast recedes as the level holds; that is no warning. True when every
        forecast made from exhaustion_countdown_s (the newest one at least that old) to half of
        it ago said at least half the time since then more than this one (or this one says the
        band is already full)."""
        span = self.th.exhaustion_countdown_s
        if left == 0.0 or span <= 0:
            return True
        if not self._forecasts or self._forecasts[0][0] > now - span:
            return False  # not enough history yet
        # the forecasts kept start at the newest one at least `span` old: never an empty test
        return all(
            f is not None and f >= left + (now - t) / 2
            for t, f in self._forecasts
            if t <= now - span / 2
        )

    def _refuted(self, now: float) -> bool:
        """A forecast made in the kept span gave a time that has passed exhaustion_refuted_factor
        times over, plus the slack, and the cache has not run out since (no usage of 100%, no
        preemption): the band overstates this load's peaks. The check is short-lived on
        purpose; replayed with a minute of forecasts, the noisy ones of a load's first seconds
        vetoed every warning of most ramps (docs/detection.md)."""
        k, slack = self.th.exhaustion_refuted_factor, self.th.exhaustion_refuted_slack_s
        if k <= 0:
            return False
        made = [t for t, f in self._forecasts if f is not None and now > t + k * f + slack]
        if not made:
            return False
        newest = max(made)
        since = now - newest  # the newest refuted one: if the cache ran out since, it did
        full = (self.timeline.peak("kv_usage", since, now) or 0.0) >= 1.0
        if full or self.timeline.increase("preemptions_total", since, now):
            return False
        rise, span = self.th.exhaustion_refuted_rise, self.th.exhaustion_for_s
        if rise <= 0:
            return True
        then = self._mean_usage(newest - span, newest)
        lately = self._mean_usage(now - span, now)
        return then is None or lately is None or lately - then <= rise

    def _mean_usage(self, start: float, end: float) -> float | None:
        """KV usage's mean over the points in [start, end]; None without one."""
        vals = [o.kv_usage for t, o in self.timeline.window(end - start, end)
                if t <= end and o.kv_usage is not None]  # fmt: skip
        return sum(vals) / len(vals) if vals else None

    def _remember_forecast(self, now: float, left: float | None) -> None:
        """Keep the forecasts since the newest one at least exhaustion_countdown_s old."""
        self._forecasts.append((now, left))
        span = self.th.exhaustion_countdown_s
        while len(self._forecasts) > 1 and self._forecasts[1][0] <= now - span:
            self._forecasts.popleft()

    def _judge_imminent(self, now: float, unix: float, sig: EngineSignals) -> None:
        """Warned before it runs out, quiet once it has: saturation and thrashing have their
        own pages, so the warning clears at once when they take over (no double page). A
        forecast that drifts past the horizon clears it only after exit_after_s (the states'
        own hysteresis), so a forecast that swings about the horizon does not warn twice. A
        forecast proved wrong (_refuted) is no warning either: one that has not fired yet is
        dropped at once, a fired one lapses."""
        if self.detector.level >= Level.SATURATED:
            self.exhaustion_imminent_since = self._imminent_lapsed_at = None
            return
        left, th = sig.seconds_to_exhaustion, self.th
        refuted = self._refuted(now)
        if (
            not refuted
            and left is not None
            and left <= th.exhaustion_warn_s
            and self._counting_down(now, left)
        ):
            self._imminent_lapsed_at = None
            if self.exhaustion_imminent_since is None:
                self.exhaustion_imminent_since = unix
            return
        since = self.exhaustion_imminent_since
        if since is None:
            return
        if refuted and unix - since < th.exhaustion_for_s:
            # not yet fired: a forecast proved wrong drops it; a fired one lapses as below
            self.exhaustion_imminent_since = self._imminent_lapsed_at = None
            return
        if self._imminent_lapsed_at is None:
            self._imminent_lapsed_at = unix
        if unix - self._imminent_lapsed_at >= th.exit_after_s:
            self.exhaustion_imminent_since = self._imminent_lapsed_at = None

    def _judge_prefix_cache(self, unix: float, sig: EngineSignals) -> None:
        """Held from its first sight; cleared once false for exit_after_s, so a share that
        swings about the line does not raise it twice."""
        view = PrefixCacheView(
            sig.prompt_cache_hit_share_long, sig.prompt_cache_hit_reference,
            sig.prompt_tokens_per_s_long, sig.prompt_tokens_recomputed_per_s,
        )  # fmt: skip
        reasons = prefix_cache_thrashing(view, self.th)
        if reasons is not None:
            self.prefix_reasons, self._prefix_lapsed_at = tuple(reasons), None
            if self.prefix_thrashing_since is None:
                self.prefix_thrashing_since = unix
            return
        if self.prefix_thrashing_since is None:
            return
        if self._prefix_lapsed_at is None:
            self._prefix_lapsed_at = unix
        if unix - self._prefix_lapsed_at >= self.th.exit_after_s:
            self.prefix_thrashing_since = self._prefix_lapsed_at = None
            self.prefix_reasons = ()

    @property
    def level(self) -> Level:
        return self.detector.level

    def observe(
        self,
        now: float,
        unix: float,
        obs: EngineObservation,
        fallback: CacheConfig | None,
        policy: str | None = None,
        time_scale: float | None = None,
    ) -> Judged:
        """One scrape of this engine; `policy`: the server's --scheduling-policy, where known;
        `time_scale`: a twin's (its gaps are judged on its simulated clock)."""
        step = self.timeline.add(now, obs)
        rejected = step is None
        broken = self.stalls.broken
        self.stalls.add(now, obs.itl_buckets, step, time_scale)
        refused = self.stalls.broken > broken
        if step is None:
            step = dict.fromkeys(COUNTERS, 0.0)
        growth = self._growth_for(obs.cache or fallback)
        share = 0.0 if self.model is None else self.model.moe_routed_share
        sig = derive(self.timeline, now, self.th, fallback, growth, share)
        if sig is None:
            return Judged(rejected=rejected, histogram_refused=refused)
        ev = gather_evidence(self.timeline, sig, now, self.th, policy)
        raw, reasons = judge(ev, self.th, self.detector.level)
        sig = self.signals = replace(
            sig, scheduling_policy=policy, policy_preemptions_per_s=policy_preemption_rate(ev)
        )
        old = self.detector.level
        transition = None
        if self.detector.update(now, raw, reasons):
            transition = Transition(
                unix,
                self.target,
                *self.key,
                old.label,
                self.detector.level.label,
                tuple(self.detector.reasons),
            )
        self._judge_imminent(now, unix, sig)
        self._remember_forecast(now, sig.seconds_to_exhaustion)
        self._judge_prefix_cache(unix, sig)
        opened = self.episodes.current is None
        ep = self.episodes.tick(
            unix,
            self.detector.level is Level.THRASHING,
            sig,
            step["preemptions_total"],
            step["repeat_preempted_total"],
        )
        if ep is not None and opened:
            self.episode_count += 1
        return Judged(transition, ep, rejected, refused)
