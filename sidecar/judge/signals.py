"""Signals derived from one engine's timeline; each is defined in docs/signals.md.

- KV headroom: free blocks = blocks x (1 - usage); free tokens = free blocks x block size.
- New-block demand per step: running / block_size (each running request needs a fresh block every
  block_size tokens, so that many blocks are asked for per decode step on average).
- Seconds to exhaustion: until the band KV usage's peaks move in reaches 100%, at the pace it
  rose over the last minute (sidecar/judge/forecast.py, measured in docs/detection.md).
- Preemption rate: reset-corrected increase of the preemption counter over a window, per second.
- Repeat preemptions: finished requests that were preempted 2+ times, in the long window (from the
  per-request preemption histogram, vLLM 0.30+).
- Prompt cache share: prompt tokens whose KV came from a cache (prefix cache or a connector) over
  all prompt tokens, short window (prompt_tokens_by_source, 0.32+); the share the cache reached
  over the lookback, and the prompt tokens/s it now computes again (sidecar/judge/prefix_cache.py).
- Offload traffic: bytes per second between the GPU and the CPU tier each way, short window; its
  allocation failures and admission rejections counted over the long window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.forecast import WINDOW_S, KvForecast, forecast_exhaustion
from kvwatch.sidecar.judge.load_forecast import WINDOW_S as LOAD_WINDOW_S
from kvwatch.sidecar.judge.load_forecast import LoadForecast, forecast_from_load
from kvwatch.sidecar.judge.prefix_cache import prefix_cache_view
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.metrics.observe import CacheConfig, bucket_quantile

__all__ = ["EngineSignals", "derive", "cached_share", "exhaustion_seconds"]


@dataclass(frozen=True)
class EngineSignals:
    kv_usage: float | None
    running: float | None
    waiting: float | None
    waiting_capacity: float | None
    block_size: int | None
    capacity_blocks: int | None
    capacity_tokens: int | None
    free_blocks: float | None
    free_tokens: float | None
    block_demand_per_step: float | None
    generation_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    seconds_to_exhaustion: float | None
    preemptions_per_s_short: float | None
    preemptions_per_s_long: float | None
    repeat_preempted_long: float | None
    finished_long: float | None
    preemptions_observed: float  # since the sidecar began, across vLLM restarts
    counter_resets: int
    peak_demand_long: float | None  # most requests held at once (running + waiting), long window
    prompt_len_p95: float | None  # per-request lengths since the server started (histogram bound)
    output_len_p95: float | None
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float | None
    cache_dtype: str | None
    ssm_state_dtype: str | None = None
    # None where the server lacks the family (older releases, no offloading): absent, not zero
    prompt_cache_hit_share: float | None = None
    offload_load_bytes_per_s: float | None = None
    offload_store_bytes_per_s: float | None = None
    offload_allocation_failures_long: float | None = None
    offload_cpu_pinned: float | None = None
    admission_rejections_long: float | None = None
    kv_offloading_gib: float | None = None
    kv_usage_trend_per_s: float | None = None  # the forecast's fitted slope (usage per second)
    # the load's own view (load_forecast.py): blocks it holds when it levels, and the arrival
    # rate the cache holds beyond the current one (the rate that fills it / the rate now - 1)
    steady_demand_blocks: float | None = None
    load_headroom: float | None = None
    seconds_to_exhaustion_load: float | None = None
    # the prompt cache share over the long window, what it reached over the lookback, and the
    # prompt tokens/s it computes again that it served then (sidecar/judge/prefix_cache.py)
    prompt_cache_hit_reference: float | None = None
    prompt_tokens_recomputed_per_s: float | None = None
    prompt_cache_hit_share_long: float | None = None
    prompt_tokens_per_s_long: float | None = None
    # the server's --scheduling-policy as the sidecar knows it (None: not said, vLLM's fcfs),
    # and the preemptions per second of the short window judged that policy at work
    # (lower-priority requests giving way), not the cache running short (judge/detect.py)
    scheduling_policy: str | None = None
    policy_preemptions_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exhaustion_seconds(
    curve: KvForecast | None, load: LoadForecast | None, usage_check_s: float = 0.0
) -> float | None:
    """The countdown: the usage curve's where usage rises smoothly, faster and faster (a big
    cache under a growing load: the curve is exact there); elsewhere the earlier of the load's
    own forecast and the line's band (Poisson arrivals swing the usage, and the band lags;
    the load's rate integrates the swings). With `usage_check_s` > 0 the load's forecast
    counts only where the band itself reaches 100% within that many seconds: the usage is the
    check on the load, not its source. docs/detection.md measures each."""
    if curve is not None and curve.curved:
        return curve.seconds
    band = None if curve is None else curve.seconds
    by_load = None if load is None else load.seconds
    if usage_check_s > 0 and (band is None or band > usage_check_s):
        by_load = None  # the usage is flat, falling or far from full: the load's alone
    said = [f for f in (band, by_load) if f is not None]
    return min(said) if said else None


def derive(
    tl: Timeline,
    now: float,
    th: Thresholds,
    fallback: CacheConfig | None = None,
    growth_per_request: float | None = None,
    routed_share: float = 0.0,
) -> EngineSignals | None:
    """`growth_per_request`: blocks one running request adds per step, from the model's KV
    groups (kvplan); None: one full-attention group, 1 / block_size. `routed_share`: a MoE
    model's k/E (0: dense or not known), which bends the load forecast's step curve."""
    latest = tl.latest
    if latest is None:
        return None
    obs = latest[1]
    cache = obs.cache or fallback or CacheConfig()
    block_size = cache.block_size
    blocks = cache.num_blocks
    tokens = cache.kv_tokens
    if tokens is None and blocks is not None and block_size is not None:
        tokens = blocks * block_size
    usage = obs.kv_usage
    free_blocks = None if usage is None or blocks is None else blocks * max(0.0, 1.0 - usage)
    free_tokens = None if usage is None or tokens is None else tokens * max(0.0, 1.0 - usage)
    gen_rate = tl.rate("generation_tokens_total", th.short_window_s, now)
    if obs.running is None or not block_size:
        demand = None
    elif growth_per_request is not None:
        demand = obs.running * growth_per_request
    else:
        demand = obs.running / block_size
    usage_pts = [(t, o.kv_usage) for t, o in tl.window(WINDOW_S, now) if o.kv_usage is not None]
    forecast = forecast_exhaustion(usage_pts, now)
    load = forecast_from_load(tl.window(LOAD_WINDOW_S, now), now, blocks, block_size, routed_share)
    prompt_rate = tl.rate("prompt_tokens_total", th.short_window_s, now)
    hit_share = _cache_share(tl, th.short_window_s, now)
    prefix = prefix_cache_view(
        tl, now, th, _cache_share(tl, th.long_window_s, now),
        tl.rate("prompt_tokens_total", th.long_window_s, now),
    )  # fmt: skip
    return EngineSignals(
        kv_usage=usage,
        running=obs.running,
        waiting=obs.waiting,
        waiting_capacity=obs.waiting_capacity,
        block_size=block_size,
        capacity_blocks=blocks,
        capacity_tokens=tokens,
        free_blocks=free_blocks,
        free_tokens=free_tokens,
        block_demand_per_step=demand,
        generation_tokens_per_s=gen_rate,
        prompt_tokens_per_s=prompt_rate,
        seconds_to_exhaustion=exhaustion_seconds(forecast, load, th.exhaustion_usage_check_s),
        kv_usage_trend_per_s=None if forecast is None else forecast.trend_per_s,
        steady_demand_blocks=None if load is None else load.steady_demand_blocks,
        load_headroom=None if load is None else load.headroom,
        seconds_to_exhaustion_load=None if load is None else load.seconds,
        preemptions_per_s_short=tl.rate("preemptions_total", th.short_window_s, now),
        preemptions_per_s_long=tl.rate("preemptions_total", th.long_window_s, now),
        repeat_preempted_long=tl.increase("repeat_preempted_total", th.long_window_s, now),
        finished_long=tl.increase("finished_requests_total", th.long_window_s, now),
        preemptions_observed=tl.observed["preemptions_total"],
        counter_resets=tl.resets,
        peak_demand_long=tl.peak_demand(th.long_window_s, now),
        prompt_len_p95=bucket_quantile(obs.prompt_len_buckets, 0.95),
        output_len_p95=bucket_quantile(obs.output_len_buckets, 0.95),
        kv_cache_memory_bytes=cache.kv_cache_memory_bytes,
        gpu_memory_utilization=cache.gpu_memory_utilization,
        cache_dtype=cache.cache_dtype,
        ssm_state_dtype=cache.ssm_state_dtype,
        prompt_cache_hit_share=hit_share,
        prompt_cache_hit_reference=prefix.reference_share,
        prompt_tokens_recomputed_per_s=prefix.recomputed_tokens_per_s,
        prompt_cache_hit_share_long=prefix.hit_share,
        prompt_tokens_per_s_long=prefix.prompt_tokens_per_s,
        offload_load_bytes_per_s=tl.rate("offload_load_bytes_total", th.short_window_s, now),
        offload_store_bytes_per_s=tl.rate("offload_store_bytes_total", th.short_window_s, now),
        offload_allocation_failures_long=tl.increase(
            "offload_allocation_failures_total", th.long_window_s, now
        ),
        offload_cpu_pinned=obs.offload_cpu_pinned,
        admission_rejections_long=tl.increase("admission_rejections_total", th.long_window_s, now),
        kv_offloading_gib=cache.kv_offloading_gib,
    )


def _cache_share(tl: Timeline, window_s: float, now: float) -> float | None:
    return cached_share(
        tl.increase("prompt_tokens_cached_total", window_s, now),
        tl.increase("prompt_tokens_computed_total", window_s, now),
    )


def cached_share(cached: float | None, computed: float | None) -> float | None:
    """Prompt tokens served from a cache over all prompt tokens; None without any."""
    if cached is None or computed is None or cached + computed <= 0:
        return None
    return cached / (cached + computed)
