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
    "KV_USAGE", "PREEMPTIONS", "RUNNING", "WAITING", "WAITING_BY_REASON", "SWAPPED",
    "REQUEST_PREEMPTIONS", "CACHE_CONFIG", "PROMPT_TOKENS", "GENERATION_TOKENS",
    "TTFT", "ITL", "E2E", "REQUEST_SUCCESS", "PREFIX_CACHE_QUERIES", "PREFIX_CACHE_HITS",
    "REQUEST_PROMPT_TOKENS", "REQUEST_GENERATION_TOKENS",
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

FAMILIES: tuple[Family, ...] = (
    KV_USAGE, PREEMPTIONS, RUNNING, WAITING, WAITING_BY_REASON, SWAPPED, REQUEST_PREEMPTIONS,
    CACHE_CONFIG, PROMPT_TOKENS, GENERATION_TOKENS, TTFT, ITL, E2E, REQUEST_SUCCESS,
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS,
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
