"""Sizing advice from what was observed: both levers, quantified, with the arithmetic shown.

(a) More KV memory: the blocks the observed load needs at its peak, and the vLLM setting that
    gives them (`--kv-cache-memory-bytes`, `--gpu-memory-utilization`, `--kv-cache-dtype fp8`,
    tensor parallelism).
(b) Less concurrency: the `--max-num-seqs` that keeps peak demand under a safety margin.

Never advises lowering `--gpu-memory-utilization` against preemption: that shrinks the cache.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import Gpu, blocks_for
from kvwatch.sizing.kvplan import PLATFORMS, KvLayout
from kvwatch.sizing.levers import ServerInfo, Version, has_flag
from kvwatch.sizing.presets import LINK_BYTES_PER_S

__all__ = [
    "Observed",
    "PrefixCurveSeen",
    "FleetPrefixSeen",
    "Advice",
    "advise",
    "RESERVED_BLOCKS",
    "kv_bytes_per_token_from",
    "several_groups_note",
    "byte_size",
]

RESERVED_BLOCKS = 1  # vLLM keeps one block back (the null block)
MAX_GPU_MEMORY_UTILIZATION = 0.95  # above this vLLM leaves too little for activations


def kv_bytes_per_token_from(
    kv_cache_memory_bytes: float | None, blocks: int, block_size: int, source: str
) -> float:
    """KV bytes per token from what vLLM reports (cache_config_info); a source without the
    memory figure needs the model's shape instead."""
    if kv_cache_memory_bytes:
        return kv_cache_memory_bytes / (blocks * block_size)
    raise SizingError(
        f"the {source} does not say the KV bytes per token (no "
        "kv_cache_memory_bytes in cache_config_info); give --model"
    )


def several_groups_note(
    blocks: int, block_size: int, kv_tokens: int | None, sliding_window: int | None
) -> tuple[str, ...]:
    """What vLLM's own figures say when its cache has several groups or sliding windows: its
    KV cache size in tokens is not blocks x block size, or it names a window."""
    if sliding_window is None and (kv_tokens is None or kv_tokens == blocks * block_size):
        return ()
    why = (
        f"a sliding window of {sliding_window} tokens"
        if sliding_window is not None
        else f"{kv_tokens:,} tokens of KV for {blocks} blocks of {block_size}"
    )
    return (
        f"vLLM reports {why}: this model keeps several KV groups (sliding windows or "
        "states), and without --model every layer is taken as full attention, so the blocks "
        "a request holds are a guess; give --model (its config.json) for vLLM's own grouping",
    )


@dataclass(frozen=True)
class PrefixCurveSeen:
    """The prefix cache's hit rate at other sizes, from vLLM's KV events (an LRU miss-ratio
    curve, sidecar/judge/reuse_curve.py): what more memory buys in prompt tokens not computed."""

    points: tuple[tuple[int, float], ...]  # (KV blocks, hit ratio), ascending in blocks
    ideal: float  # with room for everything the traffic read
    working_set_blocks: int | None  # the size that reaches 99% of the ideal
    source: str  # how the reads were known: "parent chains", or "reports and parent chains"


@dataclass(frozen=True)
class FleetPrefixSeen:
    """A model's replicas' prefix caches together, from their KV events
    (sidecar/judge/fleet_prefix.py): what the router's spreading of prefixes costs."""

    targets: tuple[str, ...]  # the replicas' URLs
    duplicated_share: float  # of the blocks the replicas cache, the copies
    replicas_hit_ratio: float  # as routed now
    pooled_hit_ratio: float  # one cache of their memory together


@dataclass(frozen=True)
class Observed:
    """The figures advice needs; every source (run directory, sidecar, metrics) fills these."""

    capacity_blocks: int
    block_size: int
    kv_bytes_per_token: float
    peak_demand: float  # most requests the server held at once (running + waiting)
    seq_len_p95: float  # prompt + output tokens a request reaches (95th percentile)
    seq_len_max: float
    preemptions: float = 0.0
    duration_s: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None
    kv_dtype: str = "auto"
    ssm_state_dtype: str | None = None  # as vLLM resolved it; "auto" or None: the model's
    source: str = ""
    prompt_len_p95: float | None = None  # prompt tokens (p95): what admission must fit
    # the engine's KV groups (from the model, checked against vLLM): blocks a request holds
    # follow its sliding windows and states; None: one full-attention group
    layout: KvLayout | None = None
    notes: tuple[str, ...] = ()
    # from the families vLLM 0.32+ exports; None where the source has none
    admission_rejections: float | None = None  # refused at --max-num-queued-reqs/-tokens
    offload_allocation_failures: float | None = None  # stores the CPU tier had no room for
    kv_offloading_gib: float | None = None  # the server's --kv-offloading-size
    prompt_cache_hit_share: float | None = None  # prompt tokens served from a cache
    # the sidecar's prefix-cache judgement (sidecar/judge/prefix_cache.py): the share over its
    # long window, the share it reached with room, prompt tokens/s then, and whether it judges
    # the cache losing reusable prefixes
    prompt_cache_hit_share_long: float | None = None
    prompt_cache_hit_reference: float | None = None
    prompt_tokens_per_s_long: float | None = None
    prefix_cache_thrashing: bool = False
    # the miss-ratio curve a sidecar drew from the server's KV events (--kv-events)
    prefix_curve: PrefixCurveSeen | None = None
    # this engine's replicas together, where one sidecar follows all of their KV events
    fleet_prefix: FleetPrefixSeen | None = None

    def __post_init__(self) -> None:
        for f in ("capacity_blocks", "block_size", "kv_bytes_per_token"):
            if not getattr(self, f) > 0:
                raise SizingError(f"{f} must be positive (got {getattr(self, f)!r})")
        for f in ("peak_demand", "seq_len_p95", "seq_len_max", "preemptions"):
            if getattr(self, f) < 0:
                raise SizingError(f"{f} must not be negative (got {getattr(self, f)!r})")


@dataclass
class Advice:
    verdict: str
    max_num_seqs: int | None  # the admission cap, under `concurrency_flag`
    blocks_needed: int
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float | None
    fp8_suffices: bool
    concurrency_flag: str = "--max-num-seqs"
    watermark: float | None = None
    kv_offloading_gib: float | None = None
    recommended: str | None = None  # the lever that fixes this load at the least cost, and why
    advised_for: str = ""  # the server version and settings the flags were chosen for
    options: list[str] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def byte_size(b: float) -> str:
    return f"{b / 2**20:,.2f} MiB" if b < 2**30 else f"{b / 2**30:,.2f} GiB"


def _watermark(
    obs: Observed, usable: int, admit: int, layout: KvLayout | None, a: list[str]
) -> float | None:
    """The free share at which vLLM admits `admit` requests at their prompt and no more: the
    running batch then has the rest to grow into (vLLM: watermark_blocks = int(F x blocks))."""
    if obs.prompt_len_p95 is None:
        return None
    prompt = obs.prompt_len_p95
    p = max(1, layout.blocks_per_request(prompt) if layout else blocks_for(prompt, obs.block_size))
    keep = usable - admit * p  # free blocks left once `admit` prompts are in
    if keep <= 0:
        return None
    share = math.floor(keep / obs.capacity_blocks * 1000) / 1000
    if share <= 0 or share >= 1:
        return None
    a.append(
        f"watermark = floor(({usable} - {admit} x {p} prompt blocks) / {obs.capacity_blocks}, "
        f"3 places) = {share:g}"
    )
    return share


def _offload_gib(
    peak: int, usable: int, block_b: float, per_seq: int, gpu: Gpu | None, a: list[str]
) -> float | None:
    """A CPU tier that holds the blocks the peak does not fit on the GPU, and what moving one
    victim costs over the host link (the seed's swap arithmetic)."""
    over = peak - usable
    if over <= 0:
        return None
    gib = math.ceil(over * block_b / 2**30 * 10) / 10
    line = (
        f"kv-offloading-size = ceil({over} blocks over x {byte_size(block_b)}) = {gib:g} GiB; one "
        f"victim moves {per_seq} blocks = {byte_size(per_seq * block_b)}"
    )
    if gpu is not None and gpu.link in LINK_BYTES_PER_S:
        link = LINK_BYTES_PER_S[gpu.link]
        line += f", {per_seq * block_b / link * 1e3:.1f} ms each way over {gpu.link}"
    a.append(line)
    return gib


def _offload_grown(obs: Observed, sized: float | None, a: list[str]) -> float | None:
    """A CPU tier that refused stores is too small: at least twice what the server has."""
    have, failed = obs.kv_offloading_gib, obs.offload_allocation_failures
    if not have or not failed:
        return sized
    grown = max(sized or 0.0, 2 * have)
    a.append(
        f"the CPU tier of {have:g} GiB refused {failed:,.0f} stores (vLLM's "
        f"kv_offload_allocation_failure): kv-offloading-size = max({sized or 0:g}, 2 x {have:g})"
        f" = {grown:g} GiB"
    )
    return grown


def _sharing_assumption(obs: Observed) -> str:
    worst = "every request's blocks are counted as its own (worst case)"
    if obs.prompt_cache_hit_share is None:
        return f"prefix caching shares nothing: {worst}; shared prefixes need fewer blocks"
    return (
        f"the prefix cache served {obs.prompt_cache_hit_share:.0%} of prompt tokens "
        f"(vLLM's prompt_tokens_by_source); still {worst}"
    )


def _admission_assumption(obs: Observed) -> list[str]:
    if not obs.admission_rejections:
        return []
    return [
        f"vLLM refused {obs.admission_rejections:,.0f} requests at its queue limits "
        "(--max-num-queued-reqs / --max-num-queued-tokens): the demand seen is what was "
        "admitted, the offered load was higher"
    ]


def _recommend(no_room: bool, fp8: bool, cap_flag: str, cap: int, preempted: bool) -> str:
    """The lever that fixes this load at the least throughput cost, and why. `no_room`: the
    utilization the memory lever needs is past what vLLM can run with on this GPU. Without a
    preemption the cache bound by queueing: the peak's requests waited for blocks."""
    if not no_room:
        fixes = (
            "it ends the preemption"
            if preempted
            else "the peak's requests then run at once instead of waiting for blocks"
        )
        return (
            f"more KV memory: {fixes}, and it costs no throughput (more requests fit "
            "in the batch, so it usually raises it); where the GPU has no room for it, the "
            "next option"
        )
    if fp8:
        return (
            "--kv-cache-dtype fp8: the memory lever within the same GPU memory, at a small "
            "accuracy cost and no throughput cost"
        )
    return (
        f"{cap_flag} {cap}: the GPU has no room for the KV the peak needs; capping admission "
        "queues the excess instead of recomputing it (costs latency in the peak; throughput "
        "only under sustained saturation)"
    )


@dataclass(frozen=True)
class _Need:
    """What the observed peak needs, computed once and read by every lever."""

    usable: int  # blocks the scheduler can hand out
    per_seq: int  # blocks a p95 request holds
    block_b: float  # bytes per block (all KV groups)
    peak_blocks: int
    needed: int  # blocks the cache needs for the peak with the margin
    kv_bytes: int
    max_seqs: int  # the admission cap with no preemption at the p95 length
    cap_flag: str
    margin: float


def _request_blocks(obs: Observed, a: list[str]) -> tuple[int, float]:
    """Blocks a p95 request holds and bytes per block, for one KV group or several."""
    bs, layout = obs.block_size, obs.layout
    if layout is None or (len(layout.groups) == 1 and layout.groups[0].kind in ("full", "mla")):
        block_b = layout.bytes_per_block if layout else obs.kv_bytes_per_token * bs
        a.append(
            f"block = {bs} tokens x {obs.kv_bytes_per_token:,.0f} B/token = {byte_size(block_b)}"
        )
        return max(1, blocks_for(obs.seq_len_p95, bs)), block_b
    held = " + ".join(
        f"{g.held(math.ceil(obs.seq_len_p95))} ({g.kind}"
        + (f" {g.window}" if g.window else "")
        + ")"
        for g in layout.groups
    )
    a += [
        f"block = {byte_size(layout.bytes_per_block)} ({len(layout.groups)} KV groups share "
        "the pool)",
        f"a request of {obs.seq_len_p95:,.0f} tokens holds {held} blocks",
    ]
    return max(1, layout.blocks_per_request(obs.seq_len_p95)), layout.bytes_per_block


def _need(obs: Observed, margin: float, version: Version | None, a: list[str]) -> _Need:
    usable = obs.capacity_blocks - RESERVED_BLOCKS
    per_seq, block_b = _request_blocks(obs, a)
    demand = math.ceil(obs.peak_demand)
    peak_blocks = demand * per_seq
    a += [
        f"cache = {obs.capacity_blocks} blocks ({usable} usable, {RESERVED_BLOCKS} reserved)",
        f"a request reaches {obs.seq_len_p95:,.0f} tokens (p95; max {obs.seq_len_max:,.0f})"
        f" = {per_seq} blocks",
        f"peak demand {demand} requests x {per_seq} blocks = {peak_blocks} blocks"
        f" vs {usable} usable",
    ]
    max_seqs = max(1, math.floor(usable * (1 - margin) / per_seq))
    cap_flag = (
        "--max-num-active-seqs" if has_flag("--max-num-active-seqs", version) else "--max-num-seqs"
    )
    a.append(f"{cap_flag[2:]} = floor({usable} x (1 - {margin:g}) / {per_seq}) = {max_seqs}")
    needed = math.ceil(peak_blocks / (1 - margin)) + RESERVED_BLOCKS
    kv_bytes = int(needed * block_b)
    a.append(
        f"blocks needed = ceil({peak_blocks} / (1 - {margin:g})) + {RESERVED_BLOCKS}"
        f" = {needed} = {byte_size(kv_bytes)} of KV"
    )
    return _Need(
        usable, per_seq, block_b, peak_blocks, needed, kv_bytes, max_seqs, cap_flag, margin
    )


def _utilization(
    obs: Observed, n: _Need, gpu: Gpu | None, a: list[str]
) -> tuple[float | None, bool]:
    """The --gpu-memory-utilization that gives the KV needed, and whether the GPU has no room
    for it (past what vLLM can run with)."""
    if obs.gpu_memory_utilization is None or gpu is None or not gpu.memory_bytes:
        return None, False
    current = obs.kv_cache_memory_bytes or obs.capacity_blocks * n.block_b
    extra = n.kv_bytes - current
    util = obs.gpu_memory_utilization + extra / gpu.memory_bytes
    a.append(
        f"gpu-memory-utilization = {obs.gpu_memory_utilization:g} + "
        f"{byte_size(extra)} / {byte_size(gpu.memory_bytes)} = {util:.3f}"
    )
    if util <= MAX_GPU_MEMORY_UTILIZATION:
        return util, False
    a.append(f"above {MAX_GPU_MEMORY_UTILIZATION}: not reachable by utilization alone")
    return None, True


def _price(obs: Observed, n: _Need) -> str:
    """What the memory lever costs beside the KV memory the server has now, per GPU."""
    now = obs.kv_cache_memory_bytes
    if not now:
        return ""
    more = n.kv_bytes - now
    return f": {byte_size(more)} more per GPU than the {byte_size(now)} it has" if more > 0 else ""


def _cap_option(n: _Need) -> str:
    return (
        f"{n.cap_flag} {n.max_seqs} (no preemption even if every admitted request reaches "
        f"the p95 length; spikes queue instead of thrashing, at no throughput cost while the "
        f"server has compute to spare between them; under sustained saturation it admits "
        f"fewer at once and decode throughput falls: then prefer the memory lever)"
        + (
            "; unlike --max-num-seqs it leaves the runner's buffers and CUDA graphs as they are"
            if n.cap_flag == "--max-num-active-seqs"
            else ""
        )
    )


def _watermark_option(
    obs: Observed, n: _Need, version: Version | None, a: list[str]
) -> tuple[float | None, str | None]:
    watermark = _watermark(obs, n.usable, n.max_seqs, obs.layout, a)
    if watermark is None or not has_flag("--watermark", version):
        return None, None
    return watermark, (
        f"--watermark {watermark:g} (admit a waiting or preempted request only while "
        f"{watermark:.0%} of the blocks stay free for the running batch to grow into; "
        "it stops re-admitted victims being preempted again, but admits nothing until "
        "a batch has mostly finished: it serializes batches under steady load)"
    )


def _offload_option(
    obs: Observed, n: _Need, gpu: Gpu | None, version: Version | None, a: list[str]
) -> tuple[float | None, str | None]:
    offload = _offload_gib(n.peak_blocks, n.usable, n.block_b, n.per_seq, gpu, a)
    offload = _offload_grown(obs, offload, a)
    if offload is None or not has_flag("--kv-offloading-size", version):
        return None, None
    return offload, (
        f"--kv-offloading-size {offload:g} (a CPU tier for the blocks that do not fit: "
        "preempted and evicted blocks can come back over the host link instead of "
        "being recomputed; it costs host memory and transfer time, not GPU memory)"
    )


def _policy_assumption(server: ServerInfo) -> list[str]:
    """Under priority scheduling the sizing still holds the whole mix; say what it means."""
    if server.scheduling_policy != "priority":
        return []
    return [
        "the server runs --scheduling-policy priority: when the cache runs short its "
        "lowest-priority running requests give way first (the policy at work, reported by the "
        "sidecar, not paged). The blocks above hold the whole mix, every class; if the lower "
        "classes are meant to give way, the higher classes' share of the peak is what must fit"
    ]


def _assumptions(obs: Observed, margin: float) -> list[str]:
    return [
        *(obs.notes if obs.layout is None else ()),
        f"the p95 request length ({obs.seq_len_p95:,.0f} tokens) is what each admitted "
        "request grows to; longer ones still need the margin",
        f"{margin:.0%} of blocks kept free for prompts arriving and lengths above p95",
        _sharing_assumption(obs),
        *_admission_assumption(obs),
        "never lower --gpu-memory-utilization against preemption: it shrinks the cache",
    ]


# What a server can report, generously: past these a figure is broken input (a hand-edited run,
# a hostile Prometheus), and the arithmetic on it overflowed a float.
_PLAUSIBLE = {
    "capacity_blocks": 1e12, "block_size": 1e6, "kv_bytes_per_token": 1e12,
    "peak_demand": 1e9, "seq_len_p95": 1e9, "seq_len_max": 1e9, "preemptions": 1e15,
}  # fmt: skip


def _check_observed(obs: Observed) -> None:
    for name, most in _PLAUSIBLE.items():
        v = getattr(obs, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= most):
            raise SizingError(f"{obs.source or 'the observation'}: {name} {v!r} is no figure "
                              f"a server reports (0 to {most:g})")  # fmt: skip


def advise(
    obs: Observed,
    margin: float = 0.10,
    gpu: Gpu | None = None,
    server: ServerInfo | None = None,
) -> Advice:
    """Every lever for the observed load, ranked, with the flags the server's version has.
    `margin` is the share of blocks kept free."""
    server = server or ServerInfo()
    version = server.parsed
    if not 0 <= margin < 1:
        raise SizingError("the safety margin must be in [0, 1)")
    _check_observed(obs)
    a: list[str] = []
    n = _need(obs, margin, version, a)
    fits = n.peak_blocks <= n.usable * (1 - margin)
    fp8 = (
        obs.kv_dtype in ("auto", "bf16", "fp16")
        and 2 * n.usable * (1 - margin) >= n.peak_blocks
        and (gpu is None or PLATFORMS[gpu.platform].fp8_kv)  # vLLM refuses it without AVX-512
    )
    advice = Advice(
        verdict="fits: the observed peak stays inside the cache with the margin",
        max_num_seqs=n.max_seqs,
        blocks_needed=n.needed,
        kv_cache_memory_bytes=n.kv_bytes,
        gpu_memory_utilization=None,
        concurrency_flag=n.cap_flag,
        advised_for=server.describe(),
        fp8_suffices=fp8,
        arithmetic=a,
        assumptions=_assumptions(obs, margin) + _policy_assumption(server),
    )
    prefix = _prefix_cache_options(obs, a)
    curve = _prefix_curve_options(obs, a)
    if fits:
        if prefix:
            advice.verdict = (
                "fits for preemption, but the prefix cache loses reusable prefixes: "
                "every turn computes its whole context again"
            )
            advice.options += prefix
        advice.options += curve
        return advice
    advice.verdict = (
        f"undersized: the load needs {n.needed} blocks at its peak, the cache has "
        f"{obs.capacity_blocks}"
    )
    options = advice.options
    price = _price(obs, n)
    options.append(f"--kv-cache-memory-bytes {n.kv_bytes} (KV for {n.needed} blocks{price})")
    advice.gpu_memory_utilization, no_room = _utilization(obs, n, gpu, a)
    if advice.gpu_memory_utilization is not None:
        options.append(
            f"--gpu-memory-utilization {math.ceil(advice.gpu_memory_utilization * 100) / 100:.2f}"
        )
    if fp8:
        options.append(
            "--kv-cache-dtype fp8 (halves bytes per token: "
            f"about {2 * n.usable} usable blocks in the same memory)"
        )
    options.append(_cap_option(n))
    advice.watermark, line = _watermark_option(obs, n, version, a)
    options += [line] if line else []
    if server.arg("scheduler_reserve_full_isl") == "False":
        options.append(
            "--scheduler-reserve-full-isl (back on: this server admits a request when only "
            "its first prefill chunk fits, which over-admits long prompts into preemption)"
        )
    advice.kv_offloading_gib, line = _offload_option(obs, n, gpu, version, a)
    options += [line] if line else []
    options.append(
        "on GPUs: --tensor-parallel-size 2 (the price: twice the GPUs; each holds half the "
        "weights and, except with MLA, half the KV heads: about twice the blocks in the same "
        "KV memory per GPU)"
    )
    options += prefix + curve
    advice.recommended = _recommend(no_room, fp8, n.cap_flag, n.max_seqs, obs.preemptions > 0)
    return advice


def _prefix_cache_options(obs: Observed, a: list[str]) -> list[str]:
    """What to change when the sidecar judges the prefix cache losing reusable prefixes, with
    the recompute it costs. The memory that holds them is the working set of the live
    conversations, which the server alone does not show (vLLM's reuse gaps are recorded only
    for blocks that were reused before eviction): the load generator measures it."""
    share, ref = obs.prompt_cache_hit_share_long, obs.prompt_cache_hit_reference
    if not obs.prefix_cache_thrashing or share is None or ref is None:
        return []
    rate = obs.prompt_tokens_per_s_long
    if rate is not None:
        a.append(
            f"prompt tokens computed again = {rate:,.0f} prompt tokens/s x ({ref:.1%} served "
            f"from the cache with room - {share:.1%} now) = {rate * max(ref - share, 0):,.0f}/s"
        )
    return [
        f"prefix cache: it serves {share:.0%} of prompt tokens against {ref:.0%} with room: "
        "more KV memory for the prefixes live sessions reuse (their working set: "
        "`kvwatch loadgen run --sessions` in your conversation shape measures it and advises "
        "the --kv-cache-memory-bytes that holds it)",
        "prefix cache: --kv-offloading-size (a CPU tier keeps evicted prefixes one copy over "
        "the host link away instead of recomputing them)",
        "prefix cache, with several replicas: session affinity (cache-aware routing), so a "
        "conversation returns to the replica that holds its context",
    ]


CURVE_GAIN = 0.05  # a larger cache is advised for its prefixes when it gains this much hit rate


def _prefix_curve_options(obs: Observed, a: list[str]) -> list[str]:
    """The memory that holds the traffic's reused prefixes, from the curve the KV events drew,
    and its price; nothing where the curve shows no gain worth it."""
    out = _routing_options(obs.fleet_prefix, a)
    c = obs.prefix_curve
    if c is None or not c.points:
        return out
    now = min(c.points, key=lambda p: abs(p[0] - obs.capacity_blocks))[1]
    shown = ", ".join(f"{b:,} blocks {h:.1%}" for b, h in c.points)
    a.append(f"prefix-cache hit rate by size (vLLM's KV events, LRU, {c.source}): {shown}; "
             f"with room for everything {c.ideal:.1%}")  # fmt: skip
    need = c.working_set_blocks
    if need is None or need <= obs.capacity_blocks or c.ideal - now < CURVE_GAIN:
        return out
    block_bytes = obs.kv_bytes_per_token * obs.block_size
    more = (need - obs.capacity_blocks) * block_bytes
    return out + [
        f"prefix cache: --kv-cache-memory-bytes {math.ceil(need * block_bytes)} (room for the "
        f"prefixes this traffic reuses, {need:,} blocks: its hit rate {now:.0%} -> about "
        f"{0.99 * c.ideal:.0%}; the price: {more / 1e9:.1f} GB more KV memory per replica)"
    ]


def _routing_options(f: FleetPrefixSeen | None, a: list[str]) -> list[str]:
    """A prefix-aware router where the replicas' KV events show routing costing hits."""
    if f is None:
        return []
    a.append(f"the {len(f.targets)} replicas' prefix caches: {f.duplicated_share:.0%} of their "
             f"blocks are copies of another replica's; hit rate as routed "
             f"{f.replicas_hit_ratio:.1%}, one cache of their memory together "
             f"{f.pooled_hit_ratio:.1%}")  # fmt: skip
    if f.pooled_hit_ratio - f.replicas_hit_ratio < CURVE_GAIN:
        return []
    return [
        "router: a prefix-aware policy (vllm-router --policy cache_aware, llm-d's prefix-cache "
        "scorer, session affinity), so a conversation's turns return to the replica that "
        f"holds its context: hit rate {f.replicas_hit_ratio:.0%} -> about "
        f"{f.pooled_hit_ratio:.0%} with the same memory"
    ]
