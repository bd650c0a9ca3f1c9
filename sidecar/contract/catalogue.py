"""Everything kvwatch emits, beside sidecar/contract/vocabulary.py (everything it reads).

- every `kvwatch_*` metric the sidecar exports: name, type, labels, help;
- the state names, from the detector's `Level`;
- the series the Prometheus rules record (`kvwatch:*`);
- every alert: name, severity, `for`, `keep_firing_for`, runbook section, summary and
  description, and which path raises it (the Prometheus rules, the sidecar's own webhooks, or
  both).

The exporter, the sidecar's webhooks, the rules, the dashboards, the report and the runbook take
names and texts from here (the monitoring-mixin idea: one config feeds alerts, dashboards and
runbook links), and a test fails when one of them names something this catalogue lacks.

Alert texts are `str.format` templates. They may name the alert's labels (`{target}`,
`{model_name}`, `{engine}`, `{where}`), its value (`{value}`, `{value_pct}`), the thresholds
(`{th.thrashing_preemptions_per_s:g}`) and thresholds as percentages (`{pct[pressure_kv]}`).
The rules fill the labels and value with Prometheus template expressions, the sidecar with what
it saw, so the two paths say the same thing in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Literal

from kvwatch.sidecar.contract.levels import Level
from kvwatch.sidecar.contract.thresholds import Thresholds

__all__ = [
    "MetricType", "Metric", "METRICS", "ENGINE_GAUGES", "TARGET_LABELS", "ENGINE_LABELS",
    "STATES", "Recording", "RECORDINGS", "ROUTER_DECISIONS", "ROUTER_WORKER_HEALTH", "Route",
    "Alert", "ALERTS", "alert", "alert_for_level",
    "metric", "percentages", "human_duration", "duration_seconds", "prometheus_duration",
    "TARGET_UP", "VLLM_METRICS_PRESENT", "ENGINE_ALIVE", "SCRAPES", "SCRAPE_ERRORS",
    "EXPOSITION_PARSE_ERRORS", "REJECTED_SAMPLES",
    "SCRAPE_DURATION", "PREEMPTIONS_OBSERVED", "STALLS_OBSERVED", "STALL_SECONDS_OBSERVED",
    "COUNTER_RESETS", "LOG_PREEMPTION_WARNINGS",
    "LOG_INCIDENTS",
    "STATE", "STATE_LEVEL", "KV_EXHAUSTION_IMMINENT", "THRASHING_EPISODES", "EPISODE_PREEMPTIONS",
    "EPISODE_RECOMPUTED_TOKENS", "KV_CACHE_USAGE", "KV_CACHE_CAPACITY_BLOCKS",
    "KV_CACHE_CAPACITY_TOKENS", "KV_CACHE_BLOCK_SIZE", "KV_CACHE_FREE_BLOCKS",
    "KV_CACHE_FREE_TOKENS", "REQUESTS_RUNNING", "REQUESTS_WAITING", "REQUESTS_WAITING_CAPACITY",
    "BLOCK_DEMAND_PER_STEP", "SECONDS_TO_KV_EXHAUSTION", "KV_STEADY_DEMAND_BLOCKS",
    "KV_LOAD_HEADROOM_RATIO", "GENERATION_TOKENS_PER_SECOND",
    "PROMPT_TOKENS_PER_SECOND", "PREEMPTIONS_PER_SECOND_SHORT", "PREEMPTIONS_PER_SECOND_LONG",
    "REPEAT_PREEMPTED_REQUESTS", "PROMPT_CACHE_HIT_RATIO", "PROMPT_CACHE_HIT_REFERENCE",
    "PROMPT_TOKENS_RECOMPUTED_PER_SECOND", "PREFIX_CACHE_THRASHING",
    "PREFIX_CACHE_HIT_RATIO_AT_SIZE", "PREFIX_CACHE_IDEAL_HIT_RATIO",
    "PREFIX_CACHE_WORKING_SET_BLOCKS", "PREFIX_CACHE_RESTORED_BLOCKS", "KV_EVENT_BATCHES",
    "FLEET_PREFIX_DUPLICATED_RATIO", "FLEET_PREFIX_POOLED_HIT_RATIO",
    "FLEET_PREFIX_REPLICAS_HIT_RATIO",
    "POLICY_PREEMPTIONS_PER_SECOND",
    "KV_OFFLOAD_LOAD_BYTES_PER_SECOND",
    "KV_OFFLOAD_STORE_BYTES_PER_SECOND", "KV_OFFLOAD_ALLOCATION_FAILURES",
    "KV_OFFLOAD_CPU_PINNED_RATIO", "ADMISSION_REJECTIONS", "ALERTS_FIRING", "WEBHOOK_PENDING",
    "WEBHOOK_DELIVERED",
    "WEBHOOK_DROPPED", "LOAD_STAGE", "INTERNAL_ERRORS", "HTTP_CONNECTIONS_SHED",
    "HTTP_HANDLER_ERRORS", "LOG_LINES", "LOG_OVERSIZED_LINES",
    "LOG_ROTATIONS",
    "REC_KV_USAGE", "REC_RUNNING", "REC_WAITING", "REC_PREEMPTION_RATE", "REC_REPEAT_PREEMPTED",
    "REC_KV_SHORT", "REC_REQUEST_SHARE", "REC_PROMPT_TOKEN_SHARE", "REC_FLEET_REPLICAS",
    "REC_FLEET_SHORT", "REC_FLEET_ROOM", "REC_FLEET_KV_MAX", "REC_FLEET_KV_MIN",
    "REC_FLEET_KV_SPREAD", "REC_FLEET_PREEMPTION_SPREAD", "REC_FLEET_REQUEST_TOKENS",
    "REC_FLEET_CAPACITY", "REC_FLEET_DEMAND", "REC_FLEET_HEADROOM", "REC_FLEET_REPLICAS_NEEDED",
    "REC_FLEET_DOWN", "REC_FLEET_CAPACITY_LOST", "FLEET_RECORDINGS", "FLEET_BY",
]  # fmt: skip


class MetricType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


TARGET_LABELS: tuple[str, ...] = ("target",)
ENGINE_LABELS: tuple[str, ...] = ("target", "model_name", "engine")


@dataclass(frozen=True)
class Metric:
    """One `kvwatch_*` family. A counter's name is without `_total`, as prometheus-client
    takes it; `series` is the name its samples carry, which PromQL queries."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str

    @property
    def series(self) -> str:
        return f"{self.name}_total" if self.type is MetricType.COUNTER else self.name

    def select(self, matchers: str = "") -> str:
        """A PromQL selector for its samples."""
        return f"{self.series}{{{matchers}}}" if matchers else self.series


def _g(name: str, labels: tuple[str, ...], help: str) -> Metric:
    return Metric(name, MetricType.GAUGE, labels, help)


def _c(name: str, labels: tuple[str, ...], help: str) -> Metric:
    return Metric(name, MetricType.COUNTER, labels, help)


T, E = TARGET_LABELS, ENGINE_LABELS
TARGET_UP = _g("kvwatch_target_up", T, "1 if the last scrape worked")
VLLM_METRICS_PRESENT = _g(
    "kvwatch_vllm_metrics_present", T,
    "1 if the target exports vLLM engine metrics (0: e.g. --disable-log-stats)",
)  # fmt: skip
ENGINE_ALIVE = _g(
    "kvwatch_engine_alive", T,
    "1 if the target's engine works; 0 if it is dead (/health fails while /metrics answers, or "
    "the followed log says it died) or stuck (requests and no token); absent when unknown",
)  # fmt: skip
SCRAPES = _c("kvwatch_scrapes", T, "scrapes attempted")
SCRAPE_ERRORS = _c("kvwatch_scrape_errors", (*T, "reason"), "failed scrapes by reason")
EXPOSITION_PARSE_ERRORS = _c("kvwatch_exposition_parse_errors", T, "unreadable sample lines")
REJECTED_SAMPLES = _c(
    "kvwatch_rejected_samples", (*T, "reason"),
    "samples refused as untrue (not_finite, out_of_range, duplicate, implausible_jump)",
)  # fmt: skip
SCRAPE_DURATION = _g("kvwatch_scrape_duration_seconds", T, "last scrape duration")
TIME_SCALE = _g(
    "kvwatch_target_time_scale", T,
    "1 for a real server; a kvwatch twin's time scale K otherwise, and the sidecar judges that "
    "target in its simulated time (rates per simulated second, windows and forecasts in "
    "simulated seconds: K wall seconds each)",
)  # fmt: skip
LOG_PREEMPTION_WARNINGS = _c("kvwatch_log_preemption_warnings", T, "V0 preemption warnings read")
LOG_INCIDENTS = _c(
    "kvwatch_log_incidents", (*T, "what"),
    "incidents the followed log told of, by kind (engine_death, startup_failure, "
    "kv_cache_too_small, out_of_memory, restart, ...; docs/log-formats.md), counted once "
    "their lines have ended (about 10 s on)",
)  # fmt: skip
PREEMPTIONS_OBSERVED = _c(
    "kvwatch_preemptions_observed", E,
    "preemptions seen since the sidecar started, corrected for vLLM restarts",
)  # fmt: skip
STALLS_OBSERVED = _c(
    "kvwatch_stalls_observed", (*E, "cause"),
    "streams' gaps above the stall line (5x the median gap, at least 0.25 s) in vLLM's "
    "inter-token latency histogram since the sidecar started, by what the server did in that "
    "scrape window: preemption (the counter rose), prefill (prompt tokens computed), other "
    "(neither); fractional where a bucket straddles the line",
)  # fmt: skip
STALL_SECONDS_OBSERVED = _c(
    "kvwatch_stall_seconds_observed", (*E, "cause"),
    "seconds of those stalls (each gap the middle of its bucket; a twin's in its simulated "
    "seconds), by cause as kvwatch_stalls_observed",
)  # fmt: skip
COUNTER_RESETS = _c("kvwatch_counter_resets", E, "vLLM counter resets seen (restarts)")
STATE = _g(
    "kvwatch_state", (*E, "state"),
    "1 for the engine's current state (ok, pressure, saturated, thrashing), else 0",
)  # fmt: skip
STATE_LEVEL = _g("kvwatch_state_level", E, "0 ok, 1 pressure, 2 saturated, 3 thrashing")
THRASHING_EPISODES = _c(
    "kvwatch_thrashing_episodes", E, "thrashing episodes begun (kept across sidecar restarts)"
)
EPISODE_PREEMPTIONS = _g(
    "kvwatch_episode_preemptions", E, "preemptions in the current thrashing episode"
)
EPISODE_RECOMPUTED_TOKENS = _g(
    "kvwatch_episode_recomputed_tokens", E,
    "estimated tokens recomputed in the current thrashing episode",
)  # fmt: skip
# Engine gauges, one per signal (sidecar/judge/signals.py); windows are in the help and the docs.
KV_CACHE_USAGE = _g("kvwatch_kv_cache_usage_ratio", E, "KV cache blocks in use, 0..1")
KV_CACHE_CAPACITY_BLOCKS = _g("kvwatch_kv_cache_capacity_blocks", E, "KV cache size in blocks")
KV_CACHE_CAPACITY_TOKENS = _g("kvwatch_kv_cache_capacity_tokens", E, "KV cache size in tokens")
KV_CACHE_BLOCK_SIZE = _g("kvwatch_kv_cache_block_size_tokens", E, "tokens per KV block")
KV_CACHE_FREE_BLOCKS = _g("kvwatch_kv_cache_free_blocks", E, "KV headroom in blocks")
KV_CACHE_FREE_TOKENS = _g("kvwatch_kv_cache_free_tokens", E, "KV headroom in tokens")
REQUESTS_RUNNING = _g("kvwatch_requests_running", E, "requests in the running batch")
REQUESTS_WAITING = _g("kvwatch_requests_waiting", E, "requests waiting")
REQUESTS_WAITING_CAPACITY = _g(
    "kvwatch_requests_waiting_capacity", E,
    "requests waiting for KV capacity (preempted ones included)",
)  # fmt: skip
BLOCK_DEMAND_PER_STEP = _g(
    "kvwatch_block_demand_per_step", E,
    "new KV blocks the running batch asks for per decode step (running / block_size)",
)  # fmt: skip
SECONDS_TO_KV_EXHAUSTION = _g(
    "kvwatch_seconds_to_kv_exhaustion", E,
    "seconds until the band KV usage peaks in reaches 100% at its pace over the last minute; "
    "absent while usage is not rising",
)  # fmt: skip
KV_STEADY_DEMAND_BLOCKS = _g(
    "kvwatch_kv_steady_demand_blocks", E,
    "KV blocks the current load holds when it levels: admissions per second x how long a "
    "request holds its blocks x the blocks it holds (Little's law; absent until a request "
    "has finished)",
)  # fmt: skip
KV_LOAD_HEADROOM_RATIO = _g(
    "kvwatch_kv_load_headroom_ratio", E,
    "how much more arrival rate the cache holds at the current lengths: the rate that fills "
    "it / the rate now - 1 (0.25: 25% more; below 0: this load does not fit when it levels)",
)  # fmt: skip
KV_EXHAUSTION_IMMINENT = _g(
    "kvwatch_kv_exhaustion_imminent", E,
    "1 while the exhaustion forecast counts down inside the warning horizon and the engine is "
    "below saturated (KvwatchKvExhaustionImminent's condition), else 0",
)  # fmt: skip
GENERATION_TOKENS_PER_SECOND = _g(
    "kvwatch_generation_tokens_per_second", E, "generation throughput over the short window"
)
PROMPT_TOKENS_PER_SECOND = _g(
    "kvwatch_prompt_tokens_per_second", E, "prompt throughput over the short window"
)
PREEMPTIONS_PER_SECOND_SHORT = _g(
    "kvwatch_preemptions_per_second_short", E, "preemptions per second over the short window"
)
PREEMPTIONS_PER_SECOND_LONG = _g(
    "kvwatch_preemptions_per_second_long", E, "preemptions per second over the long window"
)
POLICY_PREEMPTIONS_PER_SECOND = _g(
    "kvwatch_policy_preemptions_per_second", E,
    "preemptions per second over the short window judged the priority policy at work "
    "(lower-priority requests giving way under --scheduling-policy priority), not the cache "
    "running short: vLLM's own count by reason where it exports one, else every preemption of "
    "a server under the priority policy; 0 under fcfs",
)  # fmt: skip
REPEAT_PREEMPTED_REQUESTS = _g(
    "kvwatch_repeat_preempted_requests", E,
    "finished requests preempted 2+ times in the long window",
)  # fmt: skip
# From families vLLM 0.32+ exports; absent where the server has no such family (older releases,
# no --kv-offloading-size), never written as 0 for "unknown".
PROMPT_CACHE_HIT_RATIO = _g(
    "kvwatch_prompt_cache_hit_ratio", E,
    "share of prompt tokens whose KV came from a cache, short window (0.32+)",
)  # fmt: skip
PROMPT_CACHE_HIT_REFERENCE = _g(
    "kvwatch_prompt_cache_hit_ratio_reference", E,
    "the prompt cache hit share the short windows reached over the last "
    "prefix_reference_window_s (their 90th percentile): what the cache hits with room",
)  # fmt: skip
PROMPT_TOKENS_RECOMPUTED_PER_SECOND = _g(
    "kvwatch_prompt_tokens_recomputed_per_second", E,
    "prompt tokens per second computed again that the prefix cache served at its reference "
    "hit share: prompt tokens/s x (reference - current share)",
)  # fmt: skip
PREFIX_CACHE_HIT_RATIO_AT_SIZE = _g(
    "kvwatch_prefix_cache_hit_ratio_at_size", (*E, "blocks", "factor"),
    "the prefix-cache hit rate this traffic would get from a cache of `blocks` KV blocks, "
    "`factor` times the server's (0.25x to 4x; 1x is its own size), from vLLM's KV events "
    "(--kv-events): an LRU miss-ratio curve of block reads, spatially sampled",
)  # fmt: skip
PREFIX_CACHE_IDEAL_HIT_RATIO = _g(
    "kvwatch_prefix_cache_ideal_hit_ratio", E,
    "the prefix-cache hit rate with room for every block this traffic read (--kv-events)",
)  # fmt: skip
PREFIX_CACHE_WORKING_SET_BLOCKS = _g(
    "kvwatch_prefix_cache_working_set_blocks", E,
    "the smallest cache (KV blocks) that reaches 99% of the ideal hit rate (--kv-events)",
)  # fmt: skip
PREFIX_CACHE_RESTORED_BLOCKS = _c(
    "kvwatch_prefix_cache_restored_blocks", E,
    "blocks vLLM stored again after it had removed them from the prefix cache: prefix-cache "
    "thrash, counted from its KV events (--kv-events)",
)  # fmt: skip
FLEET_PREFIX_DUPLICATED_RATIO = _g(
    "kvwatch_fleet_prefix_cache_duplicated_ratio", ("model_name",),
    "of the blocks a model's replicas hold in their prefix caches now, the share that copies a "
    "block another replica holds (--kv-events on each replica)",
)  # fmt: skip
FLEET_PREFIX_POOLED_HIT_RATIO = _g(
    "kvwatch_fleet_prefix_cache_pooled_hit_ratio", ("model_name",),
    "the hit rate the replicas' reads would get from one cache of their memory together: what "
    "a prefix-aware router comes near (--kv-events on each replica)",
)  # fmt: skip
FLEET_PREFIX_REPLICAS_HIT_RATIO = _g(
    "kvwatch_fleet_prefix_cache_replicas_hit_ratio", ("model_name",),
    "the hit rate the replicas get as routed now (their own curves at their sizes, weighted by "
    "reads); below the pooled one by what routing costs",
)  # fmt: skip
KV_EVENT_BATCHES = _c(
    "kvwatch_kv_event_batches", (*T, "outcome"),
    "KV event batches from a server's publisher (--kv-events): received, replayed (recovered "
    "after a gap), missed (lost for good), refused (not a KV event batch)",
)  # fmt: skip
PREFIX_CACHE_THRASHING = _g(
    "kvwatch_prefix_cache_thrashing", E,
    "1 while the prefix cache has lost reusable prefixes (hit share down to "
    "1 - prefix_hit_drop of its reference, KvwatchPrefixCacheThrashing's condition), else 0",
)  # fmt: skip
KV_OFFLOAD_LOAD_BYTES_PER_SECOND = _g(
    "kvwatch_kv_offload_load_bytes_per_second", E,
    "bytes per second loaded from the CPU offload tier into the KV cache, short window",
)  # fmt: skip
KV_OFFLOAD_STORE_BYTES_PER_SECOND = _g(
    "kvwatch_kv_offload_store_bytes_per_second", E,
    "bytes per second stored from the KV cache into the CPU offload tier, short window",
)  # fmt: skip
KV_OFFLOAD_ALLOCATION_FAILURES = _g(
    "kvwatch_kv_offload_allocation_failures", E,
    "offload stores that found the CPU tier full, in the long window",
)  # fmt: skip
KV_OFFLOAD_CPU_PINNED_RATIO = _g(
    "kvwatch_kv_offload_cpu_pinned_ratio", E,
    "share of the CPU offload tier pinned by transfers in flight (not its occupancy)",
)  # fmt: skip
ADMISSION_REJECTIONS = _g(
    "kvwatch_admission_rejections", E,
    "requests vLLM refused at its queue limits in the long window (booked on engine 0)",
)  # fmt: skip
ALERTS_FIRING = _g("kvwatch_alerts_firing", ("alertname",), "the sidecar's own alerts now firing")
WEBHOOK_PENDING = _g("kvwatch_webhook_pending", ("receiver",), "notifications not yet delivered")
WEBHOOK_DELIVERED = _c("kvwatch_webhook_delivered", ("receiver",), "notifications delivered")
WEBHOOK_DROPPED = _c(
    "kvwatch_webhook_dropped", ("receiver",), "notifications dropped from a full outbox"
)
LOAD_STAGE = _g(
    "kvwatch_load_stage", ("stage",), "1 while a load generator stage runs (for annotations)"
)
INTERNAL_ERRORS = _c(
    "kvwatch_internal_errors", ("loop",),
    "exceptions a background loop caught before it restarted (scrape:URL, log, alerts, webhooks)",
)  # fmt: skip
HTTP_CONNECTIONS_SHED = _c(
    "kvwatch_http_connections_shed", (),
    "connections to the sidecar's endpoint closed unanswered: the oldest still sending their "
    "request, evicted past 512 open",
)  # fmt: skip
HTTP_HANDLER_ERRORS = _c(
    "kvwatch_http_handler_errors", (),
    "requests to the sidecar's endpoint whose handler raised: answered 500, logged at most once "
    "a minute",
)  # fmt: skip
LOG_LINES = _c("kvwatch_log_lines", ("source",), "log lines read")
LOG_OVERSIZED_LINES = _c(
    "kvwatch_log_oversized_lines", ("source",), "log lines dropped as too long"
)
LOG_ROTATIONS = _c("kvwatch_log_rotations", ("source",), "log rotations and truncations followed")
del T, E

# (gauge, the EngineSignals field it exports), in exposition order.
ENGINE_GAUGES: tuple[tuple[Metric, str], ...] = (
    (KV_CACHE_USAGE, "kv_usage"),
    (KV_CACHE_CAPACITY_BLOCKS, "capacity_blocks"),
    (KV_CACHE_CAPACITY_TOKENS, "capacity_tokens"),
    (KV_CACHE_BLOCK_SIZE, "block_size"),
    (KV_CACHE_FREE_BLOCKS, "free_blocks"),
    (KV_CACHE_FREE_TOKENS, "free_tokens"),
    (REQUESTS_RUNNING, "running"),
    (REQUESTS_WAITING, "waiting"),
    (REQUESTS_WAITING_CAPACITY, "waiting_capacity"),
    (BLOCK_DEMAND_PER_STEP, "block_demand_per_step"),
    (SECONDS_TO_KV_EXHAUSTION, "seconds_to_exhaustion"),
    (KV_STEADY_DEMAND_BLOCKS, "steady_demand_blocks"),
    (KV_LOAD_HEADROOM_RATIO, "load_headroom"),
    (GENERATION_TOKENS_PER_SECOND, "generation_tokens_per_s"),
    (PROMPT_TOKENS_PER_SECOND, "prompt_tokens_per_s"),
    (PREEMPTIONS_PER_SECOND_SHORT, "preemptions_per_s_short"),
    (PREEMPTIONS_PER_SECOND_LONG, "preemptions_per_s_long"),
    (POLICY_PREEMPTIONS_PER_SECOND, "policy_preemptions_per_s"),
    (REPEAT_PREEMPTED_REQUESTS, "repeat_preempted_long"),
    (PROMPT_CACHE_HIT_RATIO, "prompt_cache_hit_share"),
    (PROMPT_CACHE_HIT_REFERENCE, "prompt_cache_hit_reference"),
    (PROMPT_TOKENS_RECOMPUTED_PER_SECOND, "prompt_tokens_recomputed_per_s"),
    (KV_OFFLOAD_LOAD_BYTES_PER_SECOND, "offload_load_bytes_per_s"),
    (KV_OFFLOAD_STORE_BYTES_PER_SECOND, "offload_store_bytes_per_s"),
    (KV_OFFLOAD_ALLOCATION_FAILURES, "offload_allocation_failures_long"),
    (KV_OFFLOAD_CPU_PINNED_RATIO, "offload_cpu_pinned"),
    (ADMISSION_REJECTIONS, "admission_rejections_long"),
)

METRICS: tuple[Metric, ...] = (
    TARGET_UP, VLLM_METRICS_PRESENT, ENGINE_ALIVE, SCRAPES, SCRAPE_ERRORS, EXPOSITION_PARSE_ERRORS,
    REJECTED_SAMPLES, SCRAPE_DURATION, TIME_SCALE, PREEMPTIONS_OBSERVED, STALLS_OBSERVED,
    STALL_SECONDS_OBSERVED, COUNTER_RESETS,
    LOG_PREEMPTION_WARNINGS, LOG_INCIDENTS, STATE, STATE_LEVEL, KV_EXHAUSTION_IMMINENT,
    PREFIX_CACHE_THRASHING, THRASHING_EPISODES, EPISODE_PREEMPTIONS, EPISODE_RECOMPUTED_TOKENS,
    *(m for m, _ in ENGINE_GAUGES),
    PREFIX_CACHE_HIT_RATIO_AT_SIZE, PREFIX_CACHE_IDEAL_HIT_RATIO, PREFIX_CACHE_WORKING_SET_BLOCKS,
    PREFIX_CACHE_RESTORED_BLOCKS, KV_EVENT_BATCHES, FLEET_PREFIX_DUPLICATED_RATIO,
    FLEET_PREFIX_POOLED_HIT_RATIO, FLEET_PREFIX_REPLICAS_HIT_RATIO,
    ALERTS_FIRING, WEBHOOK_PENDING, WEBHOOK_DELIVERED, WEBHOOK_DROPPED, LOAD_STAGE,
    INTERNAL_ERRORS, HTTP_CONNECTIONS_SHED, HTTP_HANDLER_ERRORS, LOG_LINES,
    LOG_OVERSIZED_LINES, LOG_ROTATIONS,
)  # fmt: skip

_BY_NAME = {m.name: m for m in METRICS} | {m.series: m for m in METRICS}


def metric(name: str) -> Metric:
    """The family a name (or a counter's `_total` series) belongs to; KeyError if none."""
    return _BY_NAME[name]


# The engine states, worst last; `kvwatch_state{state=...}` and the JSON API use these names.
STATES: tuple[str, ...] = tuple(level.label for level in Level)


@dataclass(frozen=True)
class Recording:
    """A series the Prometheus rules record from vLLM's own metrics."""

    name: str
    help: str


REC_KV_USAGE = Recording("kvwatch:vllm_kv_cache_usage:max", "highest KV usage per engine")
REC_RUNNING = Recording("kvwatch:vllm_requests_running:sum", "running requests per engine")
REC_WAITING = Recording("kvwatch:vllm_requests_waiting:sum", "waiting requests per engine")
REC_PREEMPTION_RATE = Recording(
    "kvwatch:vllm_preemptions:rate1m", "preemptions per second over 1m per engine"
)
REC_REPEAT_PREEMPTED = Recording(
    "kvwatch:vllm_repeat_preempted_requests:increase5m",
    "finished requests preempted 2+ times in the last 5m per engine",
)

# A fleet is one model's engines, every one Prometheus has for a `model_name` (replicas behind a
# router, each with its sidecar): judged where the fleet's data is, in recording rules per model.
FLEET_BY = "model_name"
# What the fleet dashboard reads of vllm-router (0.1.17, its --prometheus-port): per `worker`
# (the replica's URL) the requests its policy sent there (`policy` label), and whether its
# health check passes (1) or not (0). No model label: one router per model, as deployed here.
ROUTER_DECISIONS = "vllm_router_policy_decisions_total"
ROUTER_WORKER_HEALTH = "vllm_router_worker_health"
REC_KV_SHORT = Recording(
    "kvwatch:vllm_kv_short:bool",
    "1 if the engine ran out of KV blocks in the last minute (usage at or above saturated_kv, or "
    "a preemption), else 0",
)
REC_REQUEST_SHARE = Recording(
    "kvwatch:vllm_request_share:rate5m",
    "the engine's share of its model's finished requests over 5m: what the router sends it",
)
REC_PROMPT_TOKEN_SHARE = Recording(
    "kvwatch:vllm_prompt_token_share:rate5m",
    "the engine's share of its model's prompt tokens over 5m: above its request share, it gets "
    "the long contexts (long sessions)",
)
REC_FLEET_REPLICAS = Recording("kvwatch:fleet_replicas:count", "engines with KV usage, per model")
REC_FLEET_SHORT = Recording(
    "kvwatch:fleet_replicas_short:count", "engines that ran out of KV blocks, per model"
)
REC_FLEET_ROOM = Recording(
    "kvwatch:fleet_replicas_with_room:count",
    "engines below pressure_kv that did not run out, per model",
)
REC_FLEET_KV_MAX = Recording("kvwatch:fleet_kv_usage:max", "the fullest engine's KV usage")
REC_FLEET_KV_MIN = Recording("kvwatch:fleet_kv_usage:min", "the emptiest engine's KV usage")
REC_FLEET_KV_SPREAD = Recording(
    "kvwatch:fleet_kv_usage:spread", "fullest less emptiest engine's KV usage, per model"
)
REC_FLEET_PREEMPTION_SPREAD = Recording(
    "kvwatch:fleet_preemptions:spread",
    "most less fewest preemptions per second over 1m among a model's engines",
)
REC_FLEET_REQUEST_TOKENS = Recording(
    "kvwatch:fleet_request_tokens:mean5m",
    "prompt + generated tokens of the model's requests finished over 5m, on average: the KV a "
    "typical request holds at its end",
)
REC_FLEET_CAPACITY = Recording(
    "kvwatch:fleet_kv_capacity_tokens:sum",
    "KV capacity in tokens of the model's engines the sidecars see up",
)
REC_FLEET_DEMAND = Recording(
    "kvwatch:fleet_kv_demand_tokens:sum",
    "KV tokens the model's requests ask for: every request its engines run or queue, at the "
    "typical request's final tokens (kvwatch:fleet_request_tokens:mean5m)",
)
REC_FLEET_HEADROOM = Recording(
    "kvwatch:fleet_kv_headroom_requests",
    "requests of the typical size the model's fleet can still take before its KV usage reaches "
    "pressure_kv (negative: requests over it): the signal an autoscaler reads",
)
REC_FLEET_REPLICAS_NEEDED = Recording(
    "kvwatch:fleet_replicas_needed",
    "engines of the fleet's mean capacity that hold the demand below pressure_kv: what an "
    "autoscaler sets the replicas to (KEDA's AverageValue target 1)",
)
REC_FLEET_DOWN = Recording(
    "kvwatch:fleet_replicas_down:count",
    "engines seen in the last hour whose server is now down or dead (the sidecar says so, or "
    "the sidecar itself is down), per model",
)
REC_FLEET_CAPACITY_LOST = Recording(
    "kvwatch:fleet_kv_capacity_lost_tokens:sum",
    "KV capacity in tokens of those down or dead engines (their last hour's), per model",
)
FLEET_RECORDINGS: tuple[Recording, ...] = (
    REC_KV_SHORT, REC_REQUEST_SHARE, REC_PROMPT_TOKEN_SHARE, REC_FLEET_REPLICAS, REC_FLEET_SHORT,
    REC_FLEET_ROOM, REC_FLEET_KV_MAX, REC_FLEET_KV_MIN, REC_FLEET_KV_SPREAD,
    REC_FLEET_PREEMPTION_SPREAD, REC_FLEET_REQUEST_TOKENS, REC_FLEET_CAPACITY, REC_FLEET_DEMAND,
    REC_FLEET_HEADROOM, REC_FLEET_REPLICAS_NEEDED, REC_FLEET_DOWN, REC_FLEET_CAPACITY_LOST,
)  # fmt: skip
RECORDINGS: tuple[Recording, ...] = (
    REC_KV_USAGE, REC_RUNNING, REC_WAITING, REC_PREEMPTION_RATE, REC_REPEAT_PREEMPTED,
    *FLEET_RECORDINGS,
)  # fmt: skip


class Route(StrEnum):
    """Who raises an alert: a Prometheus rule, the sidecar's own webhooks, or both."""

    RULES = "rules"
    WEBHOOK = "webhook"


@dataclass(frozen=True)
class Alert:
    """One alert's identity. `for_` is a Prometheus duration; `for_threshold` names the
    Thresholds field (seconds) that sets it instead, so the sidecar and the rule wait alike."""

    name: str
    severity: Literal["critical", "warning"]
    summary: str
    description: str
    routes: frozenset[Route]
    for_: str | None = None
    for_threshold: str | None = None
    keep_firing_for: str | None = None
    level: Level | None = None  # the engine state the sidecar raises it for
    # "engine": one alert per vLLM engine (labelled vllm_instance, model_name, engine);
    # "fleet": one per model, whatever its replicas (labelled model_name only)
    scope: Literal["engine", "fleet"] = "engine"
    # alerts Alertmanager holds back while this one fires, for the same engine (an engine alert)
    # or the same model (a fleet alert): the shipped routing's inhibit rules
    holds_back: tuple[str, ...] = ()

    @property
    def equal_labels(self) -> tuple[str, ...]:
        """The labels an alert it holds back must share with it."""
        return (FLEET_BY,) if self.scope == "fleet" else ("vllm_instance", "model_name", "engine")

    @property
    def runbook_section(self) -> str:
        """The runbook's `## ...` heading for it; its anchor is the name in lower case."""
        return self.name

    def runbook_url(self, th: Thresholds) -> str:
        return f"{th.runbook_base_url}#{self.name.lower()}"

    def for_seconds(self, th: Thresholds) -> float:
        if self.for_threshold is not None:
            return float(getattr(th, self.for_threshold))
        return duration_seconds(self.for_ or "0s")

    def for_duration(self, th: Thresholds) -> str:
        """`for:` as a Prometheus duration."""
        if self.for_threshold is None:
            return self.for_ or "0s"
        return prometheus_duration(self.for_seconds(th))

    def texts(self, th: Thresholds, **values: str) -> tuple[str, str]:
        """(summary, description) with the labels and value given; thresholds are filled in."""
        ctx = {"th": th, "pct": percentages(th), **values}
        return self.summary.format(**ctx), self.description.format(**ctx)


def percentages(th: Thresholds) -> dict[str, str]:
    """Each fraction threshold as a percentage (`0.9` -> `90%`), for alert texts."""
    out = {}
    for f in fields(th):
        v = getattr(th, f.name)
        if isinstance(v, float) and 0 <= v <= 1:
            out[f.name] = f"{v * 100:g}%"
    return out


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float:
    """A Prometheus duration of one unit (`90s`, `2m`, `1h`, `7d`) in seconds; ValueError for
    anything else (it goes into PromQL)."""
    if len(text) < 2 or text[-1] not in _UNITS or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise ValueError(f"not a duration like 90s, 5m, 1h or 7d: {text[:40]!r}")
    return float(text[:-1]) * _UNITS[text[-1]]


def human_duration(seconds: float) -> str:
    """`120` -> `2 minutes`, `30` -> `30 s`: for alert texts."""
    for unit, word in ((3600, "hour"), (60, "minute")):
        if seconds >= unit and seconds % unit == 0:
            n = seconds / unit
            return f"{n:g} {word}{'s' if n != 1 else ''}"
    return f"{seconds:.0f} s"


def prometheus_duration(seconds: float) -> str:
    """Seconds as the shortest Prometheus duration (`120` -> `2m`)."""
    for unit in ("h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


RULES, WEBHOOK, BOTH = (
    frozenset({Route.RULES}), frozenset({Route.WEBHOOK}), frozenset({Route.RULES, Route.WEBHOOK}),
)  # fmt: skip

ALERTS: tuple[Alert, ...] = (
    Alert(
        "VllmKvCachePressure", "warning",
        "vLLM KV cache above {pct[pressure_kv]} on {where}",
        "KV cache usage is {value_pct}, above {pct[pressure_kv]} for 10 minutes: little room "
        "for new prompts.",
        RULES, for_="10m",
    ),
    Alert(
        "VllmKvCacheSaturated", "critical",
        "vLLM KV cache full with requests waiting on {where}",
        "The KV cache ran out (usage at or above {pct[saturated_kv]}, or requests preempted) "
        "while requests waited or were refused at the queue limit, minute after minute for 5 "
        "minutes.",
        # a failed scrape of vLLM marks its series stale: without keep_firing_for the page
        # resolves, then pages again 5 minutes later while the cache stayed full
        RULES, for_="5m", keep_firing_for="2m",
    ),
    Alert(
        "VllmPreemptionRateHigh", "warning",
        "vLLM preempting requests on {where}",
        "{value} preemptions per second, above {th.thrashing_preemptions_per_s:g}/s for 5 "
        "minutes: requests are evicted from the KV cache and recomputed.",
        RULES, for_="5m",
    ),
    Alert(
        "VllmRepeatedPreemptions", "warning",
        "vLLM requests preempted again and again on {where}",
        "{value} requests finished in the last 5 minutes after being preempted twice or more: "
        "the same work is being redone.",
        RULES, for_="5m",
    ),
    Alert(
        "VllmKvOffloadTierFull", "warning",
        "vLLM's CPU KV offload tier is full on {where}",
        "{value} KV offload stores found no room in the CPU tier in the last 5 minutes, for 5 "
        "minutes: evicted and preempted blocks are dropped and recomputed instead of loaded "
        "back. Raise --kv-offloading-size.",
        RULES, for_="5m",
    ),
    Alert(
        "VllmMetricsAbsent", "warning",
        "No vLLM KV cache metrics at all",
        "No series of vllm:kv_cache_usage_perc (or its older and vllm_ spellings) for 10 "
        "minutes: vLLM is down, not scraped, or runs with --disable-log-stats.",
        RULES, for_="10m",
    ),
    Alert(
        "KvwatchKvCachePressure", "warning",
        "vLLM KV cache usage is high on {target} ({model_name}, engine {engine})",
        "The kvwatch sidecar judges this engine under pressure: KV usage at or above "
        "{pct[pressure_kv]} for {th.enter_after_s:g} s (it ends below {pct[pressure_exit_kv]}).",
        WEBHOOK, for_threshold="enter_after_s", level=Level.PRESSURE,
    ),
    Alert(
        "KvwatchKvCacheSaturated", "critical",
        "vLLM KV cache full with requests waiting on {target} ({model_name}, engine {engine})",
        "The kvwatch sidecar judges this engine saturated: the cache ran out (usage at or above "
        "{pct[saturated_kv]}, or a preemption) while requests waited or were refused at the "
        "queue limit, for {th.enter_after_s:g} s.",
        WEBHOOK, for_threshold="enter_after_s", level=Level.SATURATED,
    ),
    Alert(
        "KvwatchThrashing", "critical",
        "vLLM thrashing on {target} ({model_name}, engine {engine})",
        "The kvwatch sidecar judges this engine thrashing: a sustained stream of preemptions "
        "(over {th.thrashing_preemptions_per_s:g}/s) on a full cache with work being redone. "
        "Size the cache: kvwatch advise.",
        # one failed scrape of the sidecar (a restart, a timeout on a starved host) makes its
        # series stale: without keep_firing_for the page resolves, then fires again after `for:`
        BOTH, for_="1m", keep_firing_for="1m", level=Level.THRASHING,
    ),
    Alert(
        "KvwatchKvExhaustionImminent", "warning",
        "vLLM KV cache about to run out on {target} ({model_name}, engine {engine})",
        "The kvwatch sidecar forecasts that this engine's KV cache runs out within "
        "{th.exhaustion_warn_s:g} s (the band KV usage peaks in is rising towards 100%, and the "
        "forecast has counted down for {th.exhaustion_countdown_s:g} s and not been proved "
        "wrong), for {th.exhaustion_for_s:g} s: preemptions come next. Shed or hold load "
        "now; size the cache for it (kvwatch advise). It clears once the forecast does, or "
        "when saturation or thrashing takes over.",
        # one failed scrape of the sidecar must not resolve the warning and send it again
        BOTH, for_threshold="exhaustion_for_s", keep_firing_for="30s",
    ),
    Alert(
        "KvwatchPrefixCacheThrashing", "warning",
        "vLLM prefix cache losing reusable prefixes on {target} ({model_name}, engine {engine})",
        "The kvwatch sidecar sees the prefix cache's hit share down by at least "
        "{pct[prefix_hit_drop]} from what it reached in the last "
        "{th.prefix_reference_window_s:g} s (at least {pct[prefix_min_reference]} of prompt "
        "tokens then), for {th.prefix_for_s:g} s: cached prefixes are evicted before they "
        "are reused, and every turn of a conversation computes its whole context again. "
        "Nothing is preempted, so the thrashing alerts stay quiet. Give the cache room for the "
        "working set, or route sessions to the replica that holds them (kvwatch advise).",
        # one failed scrape of the sidecar must not resolve it and send it again
        BOTH, for_threshold="prefix_for_s", keep_firing_for="1m",
    ),
    Alert(
        "KvwatchPriorityPreemption", "warning",
        "vLLM preempting lower-priority requests on {target} ({model_name}, engine {engine})",
        "Under --scheduling-policy priority, {value} preemptions per second (a 5-minute "
        "average) were lower-priority requests giving way to higher ones: the policy at work, "
        "judged pressure at most and not paged as saturation or thrashing (the shipped "
        "Alertmanager config holds back vLLM's own saturation and preemption alerts for this "
        "server meanwhile). Each victim's context is computed again on resume. If the lower "
        "classes are meant to give way, nothing is wrong; if they matter, size the cache for "
        "the whole mix (kvwatch advise).",
        RULES, for_="1m",
        holds_back=("VllmKvCacheSaturated", "VllmPreemptionRateHigh", "VllmRepeatedPreemptions"),
    ),
    Alert(
        "KvwatchFleetKvShortage", "critical",
        "{model_name} is short of KV: no replica has room",
        "{value} of the {replicas} replicas of {model_name} ran out of KV blocks (usage at or "
        "above {pct[saturated_kv]}, or preemptions) and none had room (every one at or above "
        "{pct[pressure_kv]}), for a minute: the model is short of KV, not "
        "one replica. At the demand measured now the fleet needs "
        "{replicas_needed} replicas of its mean KV size to stay below {pct[pressure_kv]}; add "
        "replicas or KV memory per replica (kvwatch advise --prometheus). The per-replica "
        "saturation, thrashing and preemption pages for {model_name} are held back meanwhile.",
        # as soon as KvwatchThrashing (1m), so that it is firing when the engines' pages are
        # grouped and holds them back; a failed scrape of one replica marks its series stale:
        # the page must not resolve
        RULES, for_="1m", keep_firing_for="2m", scope="fleet",
        holds_back=(
            "VllmKvCachePressure", "VllmKvCacheSaturated", "VllmPreemptionRateHigh",
            "VllmRepeatedPreemptions", "KvwatchThrashing", "KvwatchKvExhaustionImminent",
            "KvwatchFleetImbalance",
        ),
    ),
    Alert(
        "KvwatchFleetImbalance", "warning",
        "{where} is out of KV blocks while other replicas of {model_name} have room",
        "This replica ran out of KV blocks (usage at or above {pct[saturated_kv]}, or "
        "preemptions) minute after minute for 5 minutes while {room} of the {replicas} "
        "replicas of {model_name} stayed below {pct[pressure_kv]}: KV usage spreads "
        "{kv_spread} across them. It took {request_share} of the model's requests and "
        "{prompt_share} of its prompt tokens. The router piles work on it: route by cache and "
        "load (vllm-router --policy cache_aware) or bound session affinity, before adding "
        "memory (kvwatch advise --prometheus).",
        RULES, for_="5m",
    ),
    Alert(
        "KvwatchFleetPrefixCacheSplit", "warning",
        "{model_name}: the router splits prefixes across replicas",
        "From the replicas' KV events, one cache of their memory together would hit "
        "{value_pct} more of the prompt blocks than they hit as routed, for 10 minutes "
        "({fleet_routed} as routed, {fleet_pooled} pooled), and {fleet_copies} of their cached "
        "blocks are copies of another replica's: the router sends a conversation's turns to "
        "replicas that do not hold its context. Route by prefix (vllm-router --policy "
        "cache_aware, llm-d's prefix-cache scorer, session affinity) before adding memory "
        "(kvwatch advise --sidecar).",
        RULES, for_="10m", scope="fleet",
    ),
    Alert(
        "KvwatchFleetReplicaDown", "warning",
        "{model_name}: {value} replica(s) down or dead",
        "{value} of the replicas of {model_name} seen in the last hour are down or dead for a "
        "minute (the sidecar cannot scrape the server or its engine is dead, or the sidecar "
        "itself is down): {capacity_lost} KV tokens ({capacity_lost_share} of the model's) "
        "are gone and the others carry their load. If they run out too, "
        "KvwatchFleetKvShortage follows. A replica scaled away is not counted.",
        RULES, for_="1m", scope="fleet",
    ),
    Alert(
        "KvwatchTargetDown", "warning",
        "kvwatch cannot scrape {target}",
        "The sidecar's scrapes of {target} have failed for {down_for}.",
        BOTH, for_threshold="target_down_after_s",
    ),
    Alert(
        "KvwatchEngineDead", "critical",
        "vLLM engine dead or stuck on {target}",
        "The server's engine has not worked for {down_for}: its API may still answer, but "
        "requests fail or never get a token. Restart it, and read its log for the cause "
        "(kvwatch logs).",
        BOTH, for_threshold="engine_dead_after_s",
    ),
    Alert(
        "KvwatchVllmMetricsMissing", "warning",
        "{target} exports no vLLM engine metrics",
        "The server answers /metrics without vllm engine series for {down_for} (started with "
        "--disable-log-stats?).",
        BOTH, for_threshold="metrics_missing_after_s",
    ),
    Alert(
        "KvwatchSidecarDown", "warning",
        "kvwatch sidecar {instance} is down",
        "Prometheus cannot scrape the kvwatch sidecar for 5 minutes: thrashing would go "
        "unnoticed.",
        RULES, for_="5m",
    ),
)  # fmt: skip

_ALERTS = {a.name: a for a in ALERTS}
_FOR_LEVEL = {a.level: a for a in ALERTS if a.level is not None}


def alert(name: str) -> Alert:
    """The alert of that name; KeyError if the catalogue has none."""
    return _ALERTS[name]


def alert_for_level(level: Level) -> Alert | None:
    """The sidecar's alert for an engine in this state; None for ok."""
    return _FOR_LEVEL.get(level)
