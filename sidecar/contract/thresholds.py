"""Every threshold and window kvwatch judges KV pressure by, in one place.

The detector, the sidecar's webhook alerts and the generated Prometheus rules all read these
values, so the sidecar and Prometheus cannot disagree about what "thrashing" means. Each field
says why someone would change it. Override from the CLI with `--threshold NAME=VALUE`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["Thresholds", "DEFAULT_THRESHOLDS", "parse_overrides"]


@dataclass(frozen=True)
class Thresholds:
    # KV usage at which the cache is under pressure. Common practice alerts at 0.90; lower it for
    # bursty traffic where 90% leaves no room for a burst's prompts.
    pressure_kv: float = 0.90
    # Pressure ends below this (hysteresis), so usage hovering at the threshold does not flap.
    pressure_exit_kv: float = 0.85
    # Peak KV usage over the short window at or above which the cache counts as full. Below 1.0
    # because vLLM keeps a block in reserve and usage moves in whole blocks on small caches.
    saturated_kv: float = 0.95
    # Requests waiting (for capacity) needed to call a full cache saturated rather than just full.
    saturated_waiting: float = 1.0
    # Preemptions per second over the short window that count as a sustained stream. A single
    # preemption now and then is normal; raise it for very large batches.
    thrashing_preemptions_per_s: float = 0.5
    # ...and at least this many preemptions in the short window, so one burst is not a stream.
    thrashing_min_preemptions: float = 3.0
    # Evidence that work is redone: running requests fell to this fraction of their recent peak
    # while requests wait (preempted requests go back to the queue).
    collapse_running_fraction: float = 0.6
    # Evidence: generation throughput fell to this fraction of its recent peak while preempting.
    throughput_drop_fraction: float = 0.8
    # Evidence: the preemptions in the short window were at least this share of the requests
    # that finished in it (each victim's whole context is computed again, vLLM V1). On a big
    # cache the batch barely shrinks and throughput barely falls while a tenth of the requests
    # are recomputed; 0 turns this off. Chosen on the twin's ramps at H100 scale
    # (docs/detection.md).
    thrashing_preempted_share: float = 0.1
    # How long pressure's or saturation's conditions must hold before the state is entered, in
    # seconds: KV usage is a gauge, and one full sample is not yet a full cache.
    enter_after_s: float = 2.0
    # The same for thrashing. None by default: its conditions already span the short window (a
    # count of preemptions and evidence of redone work), and the preemption counter lags the
    # eviction anyway. Raise it to trade alert latency for fewer alerts.
    thrashing_enter_after_s: float = 0.0
    # How long the conditions must stay false before the state steps down, in seconds.
    exit_after_s: float = 15.0
    # The preemption counter rises only when a victim produces output again, by when the queue it
    # waited in may be empty: requests waiting this many seconds back still count as waiting.
    counter_lag_s: float = 5.0
    # Rate windows in seconds. Short reacts within seconds; long smooths and holds the evidence.
    short_window_s: float = 10.0
    long_window_s: float = 60.0
    # A target must stay down this long before KvwatchTargetDown fires, in the sidecar's own
    # webhooks and in the Prometheus rule alike (a vLLM restart takes 20-60 s, a big model's
    # load minutes; raise this to stay quiet through planned restarts).
    target_down_after_s: float = 120.0
    # The same for KvwatchVllmMetricsMissing: /metrics answers without vLLM's engine series.
    metrics_missing_after_s: float = 300.0
    # KvwatchEngineDead waits this long: the API answers while /health fails, or the followed
    # log told of the engine dying (vLLM's API server exits about 5 s after its engine dies,
    # unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it answering).
    engine_dead_after_s: float = 30.0
    # An engine is stuck when requests run or wait and no token is generated for this long.
    engine_stuck_after_s: float = 60.0
    # KvwatchKvExhaustionImminent fires when the forecast (sidecar/judge/forecast.py) says the cache
    # runs out within this many seconds, while the engine is not yet saturated or thrashing.
    # Measured on ramps into preemption (docs/detection.md): raise it for an earlier warning,
    # at the price of a forecast that is further off.
    exhaustion_warn_s: float = 30.0
    # ...and only once the forecast has said so this long: one swing is not a trend.
    exhaustion_for_s: float = 5.0
    # ...and only while it counts down: the forecast made this long ago said at least half
    # this much more. A step in the load (idle, then busy and level) looks like a trend at
    # first, but its forecast recedes as the level holds. 0 turns the countdown off.
    exhaustion_countdown_s: float = 10.0
    # ...and not while the forecast has just been proved wrong: one made in that span said the
    # cache runs out in F seconds, this factor times F plus exhaustion_refuted_slack_s have
    # passed, and it has not (no usage of 100%, no preemption). A server that slows under its
    # load fills the cache to a level its peaks nearly reach, where the band says "0 s" for a
    # minute. A warning not yet fired is dropped then; a fired one lapses (clears after
    # exit_after_s). Forecasts are kept for exhaustion_countdown_s, so 0 there turns this off
    # too; exhaustion_refuted_factor=0 turns off only this.
    exhaustion_refuted_factor: float = 1.5
    # The slack is one scrape at the default interval: the cache running out is seen at a
    # scrape. 2 s let one of five held-out healthy throttled runs warn (docs/detection.md).
    exhaustion_refuted_slack_s: float = 1.0
    # ...and a forecast is proved wrong only while usage is not still rising: the mean KV usage
    # of the last exhaustion_for_s is at most this above its mean over the exhaustion_for_s
    # before the forecast was made. A fast fill the curve foresaw too soon ("0.4 s" at 77%, full
    # 8 s later) is early, not wrong; without this the check dropped its warning. Chosen on
    # every recording made before it (the fixture's 93, the twins' 40; docs/detection.md): 4
    # runs not warned first now were, no healthy run gained a warning; held out, 2 of 14 later
    # runs were warned first only with it. 0 turns the exemption off.
    exhaustion_refuted_rise: float = 0.02
    # The load's own forecast (sidecar/judge/load_forecast.py) counts only while the usage
    # agrees the cache is filling: the usage line's band reaches 100% within this many
    # seconds. The load's forecast extrapolates the step time from the batches it has seen to
    # the one that fills the cache; a light trace's batches carry its long prompts' prefill and
    # read far steeper than the full batch's, so it warned at 2-26% KV while the usage was flat
    # or rising towards 100% in 10 minutes and more. Chosen on the twins' 80 recordings before
    # it (120-300 s: 14 false warnings -> 2; 600: 7); held out, Llama's light windows 2 -> 0,
    # the MoE's 10 -> 10, no lead lost (docs/detection.md). 0 turns the check off.
    exhaustion_usage_check_s: float = 300.0
    # Prefix-cache thrashing (sidecar/judge/prefix_cache.py): how far back the hit share the
    # cache reached is looked for, in seconds. Longer remembers a good cache through a longer
    # squeeze; shorter forgets a traffic change sooner.
    prefix_reference_window_s: float = 600.0
    # ...the share of that reference hit share lost before the cache counts as thrashing
    # (0.25: a quarter of the hits gone); 0 turns prefix-cache thrashing off. On the twin a cache
    # that held its conversations stayed within a tenth, one that held half lost a third.
    prefix_hit_drop: float = 0.25
    # ...only where the reference shows reuse worth keeping (a fifth of prompt tokens).
    prefix_min_reference: float = 0.2
    # ...and with this much prompt traffic (tokens per second) in the window judged.
    prefix_min_prompt_tokens_per_s: float = 50.0
    # ...held this long, in seconds, before it is said (one quiet window is not a trend).
    prefix_for_s: float = 60.0
    # The hit rate a model's replicas leave to their router: one cache of their memory together
    # (their KV events' pooled curve) above their hit rate as routed by this much
    # (KvwatchFleetPrefixCacheSplit; on the twin, round robin over two replicas left 30 points).
    fleet_prefix_gap: float = 0.05
    # How often a still-firing alert is sent again, in seconds.
    repeat_interval_s: float = 3600.0
    # Where alert annotations point for the runbook (one section per alert).
    runbook_base_url: str = "https://github.com/kvwatch/kvwatch/blob/main/alerts/runbook.md"


DEFAULT_THRESHOLDS = Thresholds()


def parse_overrides(items: list[str], base: Thresholds = DEFAULT_THRESHOLDS) -> Thresholds:
    """`["pressure_kv=0.8", ...]` -> a new Thresholds; unknown names and bad numbers are errors."""
    known = {f.name: f.type for f in fields(Thresholds)}
    changes: dict[str, float | str] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in known:
            raise ValueError(
                f"--threshold {item!r}: use NAME=VALUE, NAME one of {', '.join(known)}"
            )
        if name == "runbook_base_url":
            changes[name] = raw
            continue
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--threshold {item!r}: {raw!r} is not a number") from None
        if value < 0:
            raise ValueError(f"--threshold {item!r}: must not be negative")
        changes[name] = value
    t = replace(base, **changes)  # type: ignore[arg-type]
    if t.pressure_exit_kv > t.pressure_kv:
        raise ValueError("pressure_exit_kv must not exceed pressure_kv")
    return t
