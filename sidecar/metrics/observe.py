"""Turn one parsed `/metrics` body into one typed observation per (model, engine).

`vllm:cache_config_info` carries `engine` but no `model_name`, so capacity is joined on engine.
V0 servers have no `engine` label: their engine is "" (and so is their cache config's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvwatch.sidecar.contract.vocabulary import (
    ADMISSION_REJECTIONS,
    CACHE_CONFIG,
    GENERATION_TOKENS,
    ITERATION_TOKENS,
    ITL,
    KV_OFFLOAD_ALLOCATION_FAILURES,
    KV_OFFLOAD_CPU_CACHE_USAGE,
    KV_OFFLOAD_LOAD_BYTES,
    KV_OFFLOAD_STORE_BYTES,
    KV_OFFLOAD_TRANSFER_BYTES,
    KV_USAGE,
    MAX_COUNT,
    OFFLOAD_LOAD,
    OFFLOAD_STORE,
    PREEMPTIONS,
    PREEMPTIONS_BY_REASON,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PREEMPTIONS,
    REQUEST_PROMPT_TOKENS,
    RUNNING,
    SWAPPED,
    TTFT,
    WAITING,
    WAITING_BY_REASON,
    WIRE_LOOKUP,
    Family,
)
from kvwatch.sidecar.metrics.exposition import Exposition, Sample
from kvwatch.timing.server_slices import Reading

__all__ = [
    "EngineKey",
    "per_first_engine",
    "CacheConfig",
    "EngineObservation",
    "observe",
    "Buckets",
    "bucket_quantile",
    "prefix_cache_counts",
    "OBSERVED",
]

# What observe() reads: every family it takes, and the histograms whose buckets it takes (of the
# others, the sum and count). A scrape parses these lines only (OBSERVED): vLLM's body is mostly
# buckets, and those of the TTFT, the steps, the end-to-end latency and the prefill tokens, and
# the families the vocabulary names for PromQL alone, are read by nothing here (84 of the 162
# samples the vocabulary keeps of a busy 0.32 body). A test holds this to the families imported
# above.
_READS = frozenset({
    KV_USAGE, RUNNING, WAITING, SWAPPED, PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS,
    WAITING_BY_REASON, PREEMPTIONS_BY_REASON, REQUEST_PREEMPTIONS, REQUEST_PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS, CACHE_CONFIG, PROMPT_TOKENS_BY_SOURCE, PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS, KV_OFFLOAD_ALLOCATION_FAILURES, KV_OFFLOAD_CPU_CACHE_USAGE,
    ADMISSION_REJECTIONS, ITL, TTFT, ITERATION_TOKENS, KV_OFFLOAD_TRANSFER_BYTES,
    KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_STORE_BYTES,
})  # fmt: skip
_BUCKETS_READ = frozenset({ITL, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS,
                           REQUEST_PREEMPTIONS})  # fmt: skip
OBSERVED: dict[str, tuple[Family, str]] = {
    wire: (fam, suffix)
    for wire, (fam, suffix) in WIRE_LOOKUP.items()
    if fam in _READS and (suffix != "bucket" or fam in _BUCKETS_READ)
}

Buckets = tuple[tuple[float, float], ...]  # cumulative (upper bound, count), sorted

EngineKey = tuple[str, str]  # (model_name, engine)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int | None = None
    num_blocks: int | None = None
    kv_tokens: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool | None = None
    sliding_window: int | None = None  # set only when every layer slides (vLLM 0.32)
    kv_offloading_gib: float | None = None  # --kv-offloading-size: the CPU tier, GiB
    # the Mamba/GDN state dtype as vLLM resolved it ("auto": the model's); CPU platforms
    # decide it by the ISA (kvplan.PLATFORMS)
    ssm_state_dtype: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfig:
        block_size = _label_float(labels, "block_size")
        blocks = _label_float(labels, "num_gpu_blocks")
        tokens = _label_float(labels, "kv_cache_size_tokens")
        if tokens is None and block_size is not None and blocks is not None:
            tokens = block_size * blocks
        mem = _label_float(labels, "kv_cache_memory_bytes")
        prefix = labels.get("enable_prefix_caching")
        window = _label_float(labels, "sliding_window")
        return cls(
            block_size=None if block_size is None else int(block_size),
            num_blocks=None if blocks is None else int(blocks),
            kv_tokens=None if tokens is None else int(tokens),
            cache_dtype=labels.get("cache_dtype"),
            gpu_memory_utilization=_label_float(labels, "gpu_memory_utilization"),
            kv_cache_memory_bytes=None if mem is None else int(mem),
            enable_prefix_caching=None if prefix is None else prefix == "True",
            sliding_window=None if window is None else int(window),
            kv_offloading_gib=_label_float(labels, "kv_offloading_size"),
            ssm_state_dtype=labels.get("mamba_ssm_cache_dtype"),
        )


def _label_float(labels: Mapping[str, str], key: str) -> float | None:
    """A numeric label that is a size: finite and positive, or None (vLLM writes "None" for
    unset values; a broken exporter may write NaN, Inf, or a negative number)."""
    try:
        value = float(labels[key])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and 0 < value <= MAX_COUNT else None


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """What one scrape said about one engine. None: the server does not export that metric."""

    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None
    waiting_deferred: float | None = None
    swapped: float | None = None
    preemptions_total: float | None = None
    # where the server says why it preempted (num_preemptions_by_reason): a running request
    # found no block, or a lower-priority one gave way to a higher one; None: not said
    preemptions_kv_full_total: float | None = None
    preemptions_priority_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    finished_requests_total: float | None = None  # count of request_num_preemptions
    repeat_preempted_total: float | None = None  # finished requests preempted 2+ times
    prompt_len_buckets: Buckets = ()  # per-request prompt tokens (cumulative histogram)
    output_len_buckets: Buckets = ()  # per-request generated tokens
    preemption_buckets: Buckets = ()  # preemptions per finished request
    cache: CacheConfig | None = None
    # 0.32+: where prompt KV came from (prompt_tokens_by_source)
    prompt_tokens_computed_total: float | None = None
    prompt_tokens_cached_total: float | None = None  # prefix cache + external transfer
    # the prefix cache's own token counters (every V1 server): what its hit rate is made of
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    # --kv-offloading-size: traffic with the CPU tier and the stores it had no room for
    offload_load_bytes_total: float | None = None
    offload_store_bytes_total: float | None = None
    offload_allocation_failures_total: float | None = None
    offload_cpu_pinned: float | None = None
    # vLLM counts these per model in the API server; they are booked on the model's first
    # engine so that one count is not multiplied by the engines of a data-parallel server
    admission_rejections_total: float | None = None
    # histogram sums and counts a step model is calibrated from (kvwatch calibrate --metrics)
    itl_seconds_sum: float | None = None
    itl_count: float | None = None
    prompt_len_sum: float | None = None
    prompt_len_count: float | None = None
    output_len_sum: float | None = None
    output_len_count: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None
    steps_total: float | None = None  # the engine's steps (iteration_tokens_total's count)
    # every stream's gaps (cumulative histogram): the stalls between scrapes (judge/stall_seconds)
    itl_buckets: Buckets = ()

    def calibration_reading(self, t: float, scale: float = 1.0) -> Reading:
        """What `kvwatch calibrate` reads of it (timing/server_slices.py) at `t` (in the
        figures' clock: a twin's simulated seconds): the requests held (running + waiting) and
        its counters; the gaps divided by a twin's time scale. The prompt tokens computed are
        the local ones where the server says (0.32+), else every prompt token."""
        itl = self.itl_seconds_sum
        computed = self.prompt_tokens_computed_total
        return Reading(
            t=t,
            held=None if self.running is None else self.running + (self.waiting or 0.0),
            itl_sum=None if itl is None else itl / scale,
            itl_count=self.itl_count,
            prompt_sum=self.prompt_len_sum,
            prompt_count=self.prompt_len_count,
            output_sum=self.output_len_sum,
            output_count=self.output_len_count,
            preemptions=self.preemptions_total,
            ttft_sum=None if self.ttft_seconds_sum is None else self.ttft_seconds_sum / scale,
            ttft_count=self.ttft_count,
            steps=self.steps_total,
            prompt_computed=self.prompt_tokens_total if computed is None else computed,
            generated=self.generation_tokens_total,
        )


def _key(s: Sample) -> EngineKey:
    return (s.labels.get("model_name", ""), s.labels.get("engine", ""))


def _sum_by_key(samples: list[Sample]) -> dict[EngineKey, float]:
    out: dict[EngineKey, float] = {}
    for s in samples:
        if s.suffix == "" and not math.isnan(s.value):
            k = _key(s)
            out[k] = out.get(k, 0.0) + s.value
    return out


def _gauge(exp: Exposition, fam: Family) -> dict[EngineKey, float]:
    return _sum_by_key(exp.family(fam))


def observe(exp: Exposition) -> dict[EngineKey, EngineObservation]:
    kv = _gauge(exp, KV_USAGE)
    running = _gauge(exp, RUNNING)
    waiting = _gauge(exp, WAITING)
    swapped = _gauge(exp, SWAPPED)
    preempt = _gauge(exp, PREEMPTIONS)
    prompt = _gauge(exp, PROMPT_TOKENS)
    gen = _gauge(exp, GENERATION_TOKENS)
    by_reason = _by_label(exp.family(WAITING_BY_REASON), "reason")
    why = _by_label(exp.family(PREEMPTIONS_BY_REASON), "reason")
    finished: dict[EngineKey, float] = {}
    le1: dict[EngineKey, float] = {}
    for s in exp.family(REQUEST_PREEMPTIONS):
        k = _key(s)
        if s.suffix == "count":
            finished[k] = finished.get(k, 0.0) + s.value
        elif s.suffix == "bucket":
            le = s.labels.get("le", "")
            if le in ("1", "1.0"):
                le1[k] = le1.get(k, 0.0) + s.value
    prompt_len = _buckets(exp.family(REQUEST_PROMPT_TOKENS))
    output_len = _buckets(exp.family(REQUEST_GENERATION_TOKENS))
    per_request = _buckets(exp.family(REQUEST_PREEMPTIONS))
    caches = {
        s.labels.get("engine", ""): CacheConfig.from_labels(s.labels)
        for s in exp.family(CACHE_CONFIG)
    }
    by_source = _by_label(exp.family(PROMPT_TOKENS_BY_SOURCE), "source")
    cached = _add(by_source.get("local_cache_hit", {}), by_source.get("external_kv_transfer", {}))
    prefix_queries = _gauge(exp, PREFIX_CACHE_QUERIES)
    prefix_hits = _gauge(exp, PREFIX_CACHE_HITS)
    load, store = _offload_bytes(exp)
    failures = _gauge(exp, KV_OFFLOAD_ALLOCATION_FAILURES)
    pinned = _gauge(exp, KV_OFFLOAD_CPU_CACHE_USAGE)

    keys = set(kv) | set(running) | set(waiting) | set(preempt) | set(gen)
    rejected = per_first_engine(_gauge(exp, ADMISSION_REJECTIONS), keys)
    itl_sum, itl_count = _sum_count(exp.family(ITL))
    itl_buckets = _buckets(exp.family(ITL))
    prompt_sum, prompt_count = _sum_count(exp.family(REQUEST_PROMPT_TOKENS))
    output_sum, output_count = _sum_count(exp.family(REQUEST_GENERATION_TOKENS))
    ttft_sum, ttft_count = _sum_count(exp.family(TTFT))
    _, steps = _sum_count(exp.family(ITERATION_TOKENS))
    out: dict[EngineKey, EngineObservation] = {}
    for k in keys:
        fin = finished.get(k)
        out[k] = EngineObservation(
            kv_usage=kv.get(k),
            running=running.get(k),
            waiting=waiting.get(k),
            waiting_capacity=by_reason.get("capacity", {}).get(k),
            waiting_deferred=by_reason.get("deferred", {}).get(k),
            swapped=swapped.get(k),
            preemptions_total=preempt.get(k),
            # a server that says why counts both reasons, the absent one at 0
            preemptions_kv_full_total=_said(why, "kv_full", k),
            preemptions_priority_total=_said(why, "priority", k),
            prompt_tokens_total=prompt.get(k),
            generation_tokens_total=gen.get(k),
            finished_requests_total=fin,
            repeat_preempted_total=None if fin is None or k not in le1 else fin - le1[k],
            prompt_len_buckets=prompt_len.get(k, ()),
            output_len_buckets=output_len.get(k, ()),
            preemption_buckets=per_request.get(k, ()),
            cache=caches.get(k[1]),
            prompt_tokens_computed_total=by_source.get("local_compute", {}).get(k),
            prompt_tokens_cached_total=cached.get(k),
            prefix_cache_queries_total=prefix_queries.get(k),
            prefix_cache_hits_total=prefix_hits.get(k),
            offload_load_bytes_total=load.get(k),
            offload_store_bytes_total=store.get(k),
            offload_allocation_failures_total=failures.get(k),
            offload_cpu_pinned=pinned.get(k),
            admission_rejections_total=rejected.get(k),
            itl_seconds_sum=itl_sum.get(k),
            itl_count=itl_count.get(k),
            itl_buckets=itl_buckets.get(k, ()),
            prompt_len_sum=prompt_sum.get(k),
            prompt_len_count=prompt_count.get(k),
            output_len_sum=output_sum.get(k),
            output_len_count=output_count.get(k),
            ttft_seconds_sum=ttft_sum.get(k),
            ttft_count=ttft_count.get(k),
            steps_total=steps.get(k),
        )
    return out


def prefix_cache_counts(engines: Mapping[EngineKey, EngineObservation]) -> tuple[float, float]:
    """The server's prefix-cache (queries, hits) in tokens, summed over its engines (0 where
    an engine does not export them): two readings' differences make the hit rate it measured."""
    obs = engines.values()
    return (
        sum(o.prefix_cache_queries_total or 0.0 for o in obs),
        sum(o.prefix_cache_hits_total or 0.0 for o in obs),
    )


def _sum_count(samples: list[Sample]) -> tuple[dict[EngineKey, float], dict[EngineKey, float]]:
    """A histogram's _sum and _count per engine (summed over its other labels)."""
    sums: dict[EngineKey, float] = {}
    counts: dict[EngineKey, float] = {}
    for s in samples:
        into = sums if s.suffix == "sum" else counts if s.suffix == "count" else None
        if into is not None and not math.isnan(s.value):
            into[_key(s)] = into.get(_key(s), 0.0) + s.value
    return sums, counts


def _said(by: dict[str, dict[EngineKey, float]], reason: str, k: EngineKey) -> float | None:
    """A reason's count for an engine whose server exports the family at all (0 for a reason
    not yet seen: prometheus-client writes a labelled child only once it is used)."""
    if not any(k in d for d in by.values()):
        return None
    return by.get(reason, {}).get(k, 0.0)


def _by_label(samples: list[Sample], label: str) -> dict[str, dict[EngineKey, float]]:
    out: dict[str, dict[EngineKey, float]] = {}
    for s in samples:
        if s.suffix == "" and not math.isnan(s.value):
            d = out.setdefault(s.labels.get(label, ""), {})
            d[_key(s)] = d.get(_key(s), 0.0) + s.value
    return out


def _add(a: dict[EngineKey, float], b: dict[EngineKey, float]) -> dict[EngineKey, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}


def _offload_bytes(exp: Exposition) -> tuple[dict[EngineKey, float], dict[EngineKey, float]]:
    """(loaded, stored) bytes per engine: the flat families where the server writes them, else
    the older kv_offload_total_bytes by transfer_type (0.33 writes both: never add them)."""
    legacy = _by_label(exp.family(KV_OFFLOAD_TRANSFER_BYTES), "transfer_type")
    load = _gauge(exp, KV_OFFLOAD_LOAD_BYTES) or legacy.get(OFFLOAD_LOAD, {})
    store = _gauge(exp, KV_OFFLOAD_STORE_BYTES) or legacy.get(OFFLOAD_STORE, {})
    return load, store


def per_first_engine(
    per_model: dict[EngineKey, float], engines: Iterable[EngineKey]
) -> dict[EngineKey, float]:
    """A per-model count (engine label "") on the model's lowest-numbered engine; the key's
    first part may be an instance as well (`advise --prometheus`)."""
    engines = list(engines)
    out: dict[EngineKey, float] = {}
    for (model, _), value in per_model.items():
        mine = sorted((k for k in engines if k[0] == model), key=lambda k: (len(k[1]), k[1]))
        if mine:
            out[mine[0]] = value
    return out


def _buckets(samples: list[Sample]) -> dict[EngineKey, Buckets]:
    acc: dict[EngineKey, dict[float, float]] = {}
    for s in samples:
        if s.suffix != "bucket":
            continue
        try:
            le = float(s.labels.get("le", ""))
        except ValueError:
            continue
        d = acc.setdefault(_key(s), {})
        d[le] = d.get(le, 0.0) + s.value
    return {k: tuple(sorted(d.items())) for k, d in acc.items()}


def bucket_quantile(buckets: Buckets, q: float) -> float | None:
    """Upper bound of the bucket holding quantile q (conservative: sizing wants the worst case).

    In the +Inf bucket, the largest finite bound is all that can be said.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    finite = [b for b in buckets if b[0] != float("inf")]
    for le, count in buckets:
        if count >= target:
            return le if le != float("inf") else (finite[-1][0] if finite else None)
    return None
