"""vLLM's KV cache planning, re-done: groups, page sizes, blocks, capacity, blocks held per request.

The specification is vLLM 0.32's source (docs/sizing.md names the functions): per-layer specs
(`kv_cache_interface.py`), the block size the platform and attention backend force
(`platforms/`), grouping and page-size unification and `num_blocks`
(`v1/core/kv_cache_utils.py`), and what a request holds at runtime
(`single_type_kv_cache_manager.py`). `tests/sizing/test_oracle.py` checks the figures against
vLLM itself for every architecture it lists. Pure arithmetic; no vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from kvwatch.sizing.archconfig import Architecture, AttentionLayer, MlaLayer, StateLayer
from kvwatch.sizing.errors import SizingError

__all__ = [
    "Platform",
    "PLATFORMS",
    "cpu_platform",
    "Serving",
    "GroupPlan",
    "KvLayout",
    "KvPlan",
    "layout_for",
    "layout_for_engine",
    "plan",
    "longest_that_fits",
    "KV_DTYPE_BYTES",
    "capacity_line",
]

KV_DTYPE_BYTES = {
    "auto": None,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float32": 4,
}
_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Platform:
    """What vLLM's platform code decides: block sizes, async scheduling, batch defaults."""

    name: str
    default_block_size: int
    block_multiple: int  # the attention backend's kernel block: sizes must be multiples
    mla_block_size: int | None  # MLA backends force this block size (None: the default)
    async_scheduling: bool
    server_max_num_batched_tokens: int
    # the Mamba/GDN state dtype vLLM picks when the model leaves it auto (None: the model's)
    ssm_state_dtype: str | None
    fp8_kv: bool = True  # vLLM can keep the KV cache in fp8 here
    mla_overrides_user: bool = False  # the MLA block size wins over --block-size
    # the block size of the MLA backend chosen for an fp8 KV cache when --block-size is not
    # given, where it differs from the bf16 one (None: the same)
    mla_fp8_block_size: int | None = None

    @property
    def is_cpu(self) -> bool:
        return self.name.startswith("cpu")

    def block_size(self, arch: Architecture, requested: int | None, kv_dtype: str = "auto") -> int:
        if (
            arch.uses_mla
            and self.mla_fp8_block_size is not None
            and requested is None
            and kv_dtype.startswith("fp8")
        ):
            return self.mla_fp8_block_size
        if (
            arch.uses_mla
            and self.mla_block_size is not None
            and (self.mla_overrides_user or requested is None)
        ):
            return self.mla_block_size
        bs = requested if requested is not None else self.default_block_size
        if bs < 1 or bs % self.block_multiple:
            raise SizingError(
                f"block size {bs} is not a multiple of {self.block_multiple} on {self.name} "
                "(vLLM refuses it)"
            )
        return bs


def _cpu(name: str, ssm_state_dtype: str | None, fp8_kv: bool, mla_block: int | None) -> Platform:
    # vLLM's CPU backend: CPU_ATTN takes multiples of 32, default 128; the reference CPU MLA
    # forces 16 over the user's choice, AMX's MLA takes the user's (multiples of 32, default
    # 128); no async scheduling; API-server batch default 2048 x world size (platforms/cpu.py)
    return Platform(
        name, 128, 32, mla_block, False, 2048, ssm_state_dtype, fp8_kv, mla_block is not None
    )


PLATFORMS = {
    # What the CPU can do changes the plan (platforms/cpu.py, v1/attention/backends/
    # cpu_attn.py): with AVX-512 BF16 vLLM resets an auto SSM state to float32 for its
    # accelerated GDN/Mamba kernels, without it the state stays in the model's dtype; an fp8
    # KV cache needs AVX-512 (or AMX); with AMX tiles an MLA model runs on AMX_MLA
    # (v1/attention/backends/mla/amx_mla.py), which keeps the user's block size, instead of
    # the reference CPU MLA's forced 16.
    "cpu": _cpu("cpu", "float32", True, 16),  # x86 with AVX-512 BF16, no AMX
    "cpu-amx": _cpu("cpu-amx", "float32", True, None),  # AVX-512 BF16 and AMX (Sapphire Rapids+)
    "cpu-avx512": _cpu("cpu-avx512", None, True, 16),  # AVX-512 without BF16
    "cpu-avx2": _cpu("cpu-avx2", None, False, 16),  # no AVX-512
    # CUDA (Hopper/Ampere/Ada): FlashAttention MultipleOf(16), FLASH_ATTN_MLA MultipleOf(16);
    # async scheduling with model runner V2; 8192 batched tokens for the API server on >= 70 GB
    # GPUs other than A100 (2048 on smaller ones, set per GPU by the caller). An auto SSM
    # state takes the model's dtype (mamba_utils.py).
    "cuda": Platform("cuda", 16, 16, None, True, 8192, None),
    # Hopper (SM90) as "cuda", except MLA with an fp8 KV cache: FLASH_ATTN_MLA, first for SM90
    # (platforms/cuda.py), takes no fp8 cache, so FLASHMLA is chosen, whose kernel takes 64-token
    # blocks only (v1/attention/backends/mla/flashmla.py); with --block-size 16 it is passed
    # over for TRITON_MLA, which keeps the 16.
    "cuda-hopper": Platform("cuda-hopper", 16, 16, None, True, 8192, None, mla_fp8_block_size=64),
    # Blackwell: FlashInfer's MLA kernels take 32 or 64; vLLM prefers 32.
    "cuda-blackwell": Platform("cuda-blackwell", 16, 16, 32, True, 16384, None),
    # ROCm: taken with CUDA's rules (block 16, async); its AITER MLA backend is not modeled.
    "rocm": Platform("rocm", 16, 16, None, True, 16384, None),
}


def cpu_platform(flags: Iterable[str]) -> str:
    """The CPU platform for an x86 CPU with these /proc/cpuinfo flags."""
    have = set(flags)
    if "avx512f" not in have:
        return "cpu-avx2"
    if "avx512_bf16" not in have:
        return "cpu-avx512"
    return "cpu-amx" if "amx_tile" in have else "cpu"


@dataclass(frozen=True)
class Serving:
    """The vLLM settings that change the KV plan; None: vLLM's default for the platform."""

    max_model_len: int
    block_size: int | None = None
    kv_dtype: str = "auto"
    tp: int = 1
    pp: int = 1
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    hybrid_kv_cache_manager: bool | None = None
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE: 1 by default in 0.32 and 0.33 (envs.py)
    allow_chunked_local_hybrid: bool = True
    mamba_ssm_cache_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise SizingError("max_model_len must be at least 1")
        if self.tp < 1 or self.pp < 1:
            raise SizingError("tensor- and pipeline-parallel sizes must be at least 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise SizingError("max_num_batched_tokens must be at least 1")
        if self.kv_dtype not in KV_DTYPE_BYTES:
            raise SizingError(
                f"unknown KV dtype {self.kv_dtype!r}; one of {', '.join(KV_DTYPE_BYTES)}"
            )


GroupKind = Literal["full", "sliding", "chunked", "mla", "state"]


@dataclass(frozen=True)
class _Spec:
    """One layer's spec as vLLM builds it (a hashable key for grouping)."""

    kind: GroupKind
    block_size: int
    page_bytes: int  # one block of this one layer
    window: int | None = None
    state_blocks: int = 1  # state layers: blocks per request (1, or 2 + checkpoint in align)
    # part of the spec's identity, as vLLM's page_size_padded is: a padded page does not group
    # with an unpadded one of the same size
    padded: bool = False


@dataclass(frozen=True)
class GroupPlan:
    """One KV cache group: layers that share a block table."""

    kind: GroupKind
    layers: int
    block_size: int
    page_bytes: int  # per block, all of this group's layers
    window: int | None = None
    state_blocks: int = 1

    def max_blocks(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one max-length request is sized for at startup (max_memory_usage_bytes)."""
        bs = self.block_size
        if self.kind in ("full", "mla"):
            return _cdiv(max_model_len, bs)
        if self.kind == "sliding":
            assert self.window is not None
            return _cdiv(min(self.window - 1 + in_flight_tokens, max_model_len), bs) + 1
        if self.kind == "chunked":
            assert self.window is not None
            return _cdiv(min(self.window + in_flight_tokens, max_model_len), bs)
        return self.state_blocks

    def held(self, tokens: int) -> int:
        """Blocks a running request of `tokens` tokens holds in this group while it decodes:
        what `remove_skipped_blocks` leaves once the previous tokens are computed."""
        if tokens <= 0:
            return 0
        bs = self.block_size
        if self.kind == "state":
            return self.state_blocks
        allocated = _cdiv(tokens, bs)
        computed = tokens - 1
        if self.kind == "sliding":
            assert self.window is not None
            skipped = max(0, computed - self.window + 1)
        elif self.kind == "chunked":
            assert self.window is not None
            skipped = computed // self.window * self.window
        else:
            skipped = 0
        return allocated - min(skipped // bs, allocated)


@dataclass(frozen=True)
class KvLayout:
    """How one engine's KV pool is cut: what advice needs to turn lengths into blocks."""

    groups: tuple[GroupPlan, ...]
    bytes_per_block: int  # one block of the shared pool (the widest group's page)
    in_flight_tokens: int
    notes: tuple[str, ...] = ()

    @property
    def block_size(self) -> int:
        """The attention block size (what vLLM reports as block_size)."""
        sizes = [g.block_size for g in self.groups if g.kind != "state"]
        return min(sizes) if sizes else self.groups[0].block_size

    def blocks_per_request(self, tokens: float) -> int:
        t = math.ceil(tokens)
        return sum(g.held(t) for g in self.groups)

    def max_blocks_per_request(self, max_model_len: int) -> int:
        return sum(g.max_blocks(max_model_len, self.in_flight_tokens) for g in self.groups)

    def growth_per_step(self, tokens: float) -> float:
        """New blocks one decoding request asks for per step, averaged over a block."""
        t = math.ceil(tokens)
        bs = self.block_size
        return (self.blocks_per_request(t + bs) - self.blocks_per_request(t)) / bs

    @property
    def steady_growth_per_step(self) -> float:
        """New blocks one long-running decoding request asks for per step: its full-attention
        and MLA groups grow a block every block_size tokens (a chunked group too, freeing its
        chunk when the next begins); windows and states stay the same size."""
        return sum(1 / g.block_size for g in self.groups if g.kind in ("full", "mla", "chunked"))

    @property
    def bytes_per_token(self) -> float:
        """KV bytes a token costs where every layer holds it (full attention's rate)."""
        return sum(g.page_bytes / g.block_size for g in self.groups if g.kind != "state")

    def describe(self) -> list[str]:
        out = []
        for g in self.groups:
            what = {
                "full": "full attention",
                "mla": "MLA latent",
                "state": "recurrent state",
                "sliding": f"sliding window {g.window}",
                "chunked": f"chunked local {g.window}",
            }
            out.append(
                f"{g.layers} layers {what[g.kind]}, {g.block_size}-token blocks, "
                f"{g.page_bytes:,} B a block"
            )
        return out


@dataclass(frozen=True)
class KvPlan:
    """vLLM's startup figures for one budget: what its "KV cache size" line prints."""

    layout: KvLayout
    num_gpu_blocks: int
    max_model_len: int
    kv_cache_size_tokens: int
    max_concurrency: float
    kv_cache_memory_bytes: int
    arithmetic: list[str] = field(default_factory=list)

    @property
    def decode_blocks_per_request(self) -> int:
        """Blocks one max-length request holds once it decodes: a sliding window keeps only
        its window, where vLLM's startup figure also counts a prefill chunk in each window."""
        return self.layout.blocks_per_request(self.max_model_len)

    @property
    def decode_concurrency(self) -> float:
        """Max-length requests the pool holds while every one of them decodes; equal to
        `max_concurrency` for full attention and MLA, above it with sliding or chunked
        windows (the figure other planners print, and the one a busy server lives by)."""
        return self.num_gpu_blocks / max(self.decode_blocks_per_request, 1)


@dataclass(frozen=True)
class _Resolved:
    block_size: int
    kv_bytes: int
    in_flight_tokens: int
    hybrid_manager: bool
    state_dtype_bytes: int
    mamba_align: bool
    notes: tuple[str, ...]


def _resolve(arch: Architecture, serving: Serving, platform: Platform) -> _Resolved:
    """The settings vLLM ends up with: block size, KV dtype, in-flight tokens, manager."""
    _refused_parallel(arch, serving)
    notes: list[str] = []
    kv = KV_DTYPE_BYTES[serving.kv_dtype] or arch.dtype_bytes
    bs = platform.block_size(arch, serving.block_size, serving.kv_dtype)
    if serving.kv_dtype.startswith("fp8") and not platform.fp8_kv:
        raise SizingError(
            f"vLLM refuses an fp8 KV cache on {platform.name}: on CPU it needs x86 with "
            "AVX-512 or AMX"
        )
    if arch.uses_mla and bs != (serving.block_size or bs):
        notes.append(f"vLLM's MLA backend on {platform.name} forces {bs}-token blocks")
    elif arch.uses_mla and serving.block_size is None and bs != platform.default_block_size:
        notes.append(
            f"vLLM's MLA backend on {platform.name} for a {serving.kv_dtype} KV cache takes "
            f"{bs}-token blocks"
        )
    mnbt = serving.max_num_batched_tokens
    if mnbt is None:
        mnbt = platform.server_max_num_batched_tokens * (
            serving.tp * serving.pp if platform.is_cpu else 1
        )
    batches = serving.pp + 1 if platform.async_scheduling else serving.pp
    hybrid = serving.hybrid_kv_cache_manager
    chunked = any(isinstance(x, AttentionLayer) and x.kind == "chunked" for x in arch.layers)
    if chunked and not serving.allow_chunked_local_hybrid:
        if hybrid:
            raise SizingError(
                "vLLM refuses the hybrid KV cache manager with chunked local attention "
                "unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1"
            )
        hybrid = False
        notes.append(
            "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0: vLLM turns the hybrid "
            "KV cache manager off, so chunked local layers are sized as full attention"
        )
    if hybrid is None:
        hybrid = True
    if arch.is_hybrid and not hybrid:
        raise SizingError(
            f"{arch.architecture}: vLLM needs the hybrid KV cache manager for "
            "recurrent-state layers"
        )
    # the serving flag, else the platform's rule, else what the model's config pins for "auto"
    state = serving.mamba_ssm_cache_dtype or platform.ssm_state_dtype or arch.state_dtype
    if state is not None and state not in _STATE_DTYPE_BYTES:
        raise SizingError(f"unknown Mamba state dtype {state!r}")
    return _Resolved(
        block_size=bs,
        kv_bytes=kv,
        in_flight_tokens=batches * mnbt,
        hybrid_manager=hybrid,
        state_dtype_bytes=arch.dtype_bytes if state is None else _STATE_DTYPE_BYTES[state],
        mamba_align=serving.enable_prefix_caching,
        notes=tuple(notes),
    )


def _refused_parallel(arch: Architecture, serving: Serving) -> None:
    """What vLLM refuses before it plans: attention heads that TP does not divide
    (`ModelConfig.verify_with_parallel_config`), and a pipeline with a stage of no layers
    (`get_pp_indices` would give it none)."""
    heads = arch.attention_heads
    if heads and heads % serving.tp:
        raise SizingError(
            f"vLLM refuses it: {arch.architecture}'s {heads} attention heads are not divisible "
            f"by tensor-parallel size {serving.tp}"
        )
    if serving.pp > 1 and len(arch.layers) < serving.pp:
        raise SizingError(
            f"{arch.architecture} has {len(arch.layers)} layers: pipeline-parallel size "
            f"{serving.pp} would leave a stage without one"
        )


def _layer_specs(
    arch: Architecture, serving: Serving, r: _Resolved, platform: Platform
) -> list[_Spec | None]:
    """One spec per decoder layer (None where a layer keeps no KV)."""
    tp = serving.tp
    specs: list[_Spec | None] = []
    attn_1tok: int | None = None
    for layer in arch.layers:
        if isinstance(layer, AttentionLayer):
            heads = max(1, layer.kv_heads // tp)  # vLLM's get_num_kv_heads: floor, at least 1
            per_tok = (
                heads * (layer.head_size + layer.head_size_v) * (layer.pinned_bytes or r.kv_bytes)
            )
            attn_1tok = attn_1tok or per_tok
            kind: GroupKind = layer.kind
            window = layer.window
            if not r.hybrid_manager and kind in ("sliding", "chunked"):
                kind, window = "full", None
            specs.append(_Spec(kind, r.block_size, per_tok * r.block_size, window))
        elif isinstance(layer, MlaLayer):
            per_tok = layer.latent * r.kv_bytes
            attn_1tok = attn_1tok or per_tok
            specs.append(_Spec("mla", r.block_size, per_tok * r.block_size))
        elif isinstance(layer, StateLayer):
            conv, ssm = layer.shapes(tp)
            page = conv * arch.dtype_bytes + ssm * r.state_dtype_bytes + layer.fixed_bytes
            blocks = 2 + layer.checkpoint_blocks if r.mamba_align else 1
            specs.append(_Spec("state", r.block_size, page, None, blocks))
        else:
            specs.append(None)
    if any(s is not None and s.kind == "state" for s in specs):
        specs = _align_hybrid(specs, attn_1tok, r, platform)
    return specs


def _align_hybrid(
    specs: list[_Spec | None], attn_1tok: int | None, r: _Resolved, platform: Platform
) -> list[_Spec | None]:
    """platforms/interface.py `_align_hybrid_block_size`: the attention block grows until its
    page holds the largest state, then the state pages are padded to the attention page."""
    state_page = max(s.page_bytes for s in specs if s is not None and s.kind == "state")
    if attn_1tok is None:
        return specs
    align = max(platform.block_multiple, r.block_size)
    bs = align * _cdiv(state_page, align * attn_1tok)
    bs = max(platform.block_multiple * _cdiv(bs, platform.block_multiple), r.block_size)
    page = bs * attn_1tok
    out: list[_Spec | None] = []
    for s in specs:
        if s is None:
            out.append(None)
        elif s.kind == "state":
            out.append(replace(s, block_size=bs, page_bytes=page, padded=True))
        else:
            out.append(replace(s, block_size=bs, page_bytes=s.page_bytes // s.block_size * bs))
    return out


def _unify_pages(specs: dict[int, _Spec]) -> dict[int, _Spec]:
    """`unify_kv_cache_spec_page_size`: smaller pages grow their block size by the ratio."""
    top = max(s.page_bytes for s in specs.values())
    out = {}
    for i, s in specs.items():
        if s.page_bytes == top:
            out[i] = s
        elif s.kind == "state":
            out[i] = replace(s, page_bytes=top, padded=True)
        elif top % s.page_bytes == 0:
            out[i] = replace(s, block_size=s.block_size * (top // s.page_bytes), page_bytes=top)
        elif s.kind != "mla":
            out[i] = replace(s, page_bytes=top, padded=True)
        else:
            raise SizingError(
                "an MLA layer's page does not divide the largest page; vLLM cannot unify them"
            )
    return out


@dataclass(frozen=True)
class _Group:
    spec: _Spec
    members: tuple[tuple[int, int], ...]  # (layer index, page bytes)


def _groups(specs: dict[int, _Spec]) -> list[_Group]:
    """`get_kv_cache_groups` for a layer-outer layout (every platform's default)."""
    items = list(specs.items())
    first = items[0][1]
    if (
        len(set(specs.values())) == 1
        or len({(s.kind, s.window, s.block_size, s.state_blocks) for s in specs.values()}) == 1
    ):
        # one spec, or one type with different pages (UniformTypeKVCacheSpecs): one group
        return [_Group(first, tuple((i, s.page_bytes) for i, s in items))]
    specs = _unify_pages(specs)
    buckets: dict[_Spec, list[int]] = {}
    for i, s in specs.items():
        buckets.setdefault(s, []).append(i)
    counts = [len(v) for v in buckets.values()]
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    out = []
    for s, layers in buckets.items():
        num = _cdiv(len(layers), group_size)
        for i in range(num):
            out.append(_Group(s, tuple((j, s.page_bytes) for j in layers[i::num])))
    return out


def _plan_group(g: _Group, layers: set[int] | None = None) -> GroupPlan:
    members = [m for m in g.members if layers is None or m[0] in layers]
    s = g.spec
    return GroupPlan(
        s.kind, len(members), s.block_size, sum(p for _, p in members), s.window, s.state_blocks
    )


def _stages(n_layers: int, pp: int) -> list[set[int]]:
    """`get_pp_indices`: layers per pipeline stage, the remainder to the middle stages."""
    per = [n_layers // pp] * pp
    for i in range(2, n_layers % pp + 2):
        per[-i] += 1
    starts = [sum(per[:i]) for i in range(pp)]
    return [set(range(s, s + p)) for s, p in zip(starts, per, strict=True)]


def layout_for(arch: Architecture, serving: Serving, platform: Platform) -> KvLayout:
    """The groups and the pool's bytes per block (every pipeline stage plans with the global
    groups over its own layers; the stage with the widest block has the fewest blocks)."""
    r = _resolve(arch, serving, platform)
    specs = {i: s for i, s in enumerate(_layer_specs(arch, serving, r, platform)) if s}
    if not specs:
        raise SizingError(f"{arch.architecture}: no layer keeps a KV cache")
    if any(s.page_bytes <= 0 for s in specs.values()):
        raise SizingError(f"{arch.architecture}: a layer's KV page would hold no bytes")
    groups = _groups(specs)
    notes = list(r.notes)
    stages = _stages(len(arch.layers), serving.pp) if serving.pp > 1 else [None]
    widest, plans = 0, [_plan_group(g) for g in groups]
    for stage in stages:
        mine = [_plan_group(g, stage) for g in groups]
        width = max(p.page_bytes for p in mine)
        if width > widest:
            widest, plans = width, mine
    if serving.pp > 1:
        notes.append(
            f"pipeline parallel {serving.pp}: the widest stage's block is "
            f"{widest:,} B; every stage gets that stage's block count"
        )
    if len(groups) > 1 and any(p.layers < max(q.layers for q in plans) for p in plans):
        notes.append(
            "groups of unequal size: vLLM pads them, and the padding is KV memory no layer uses"
        )
    return KvLayout(tuple(plans), widest, r.in_flight_tokens, tuple(notes))


def longest_that_fits(layout: KvLayout, kv_cache_memory_bytes: int, upper: int) -> int:
    """vLLM's `_estimate_max_model_len_from_groups`: the longest max_model_len (up to `upper`)
    whose reservation fits beside the null block; 0 if not even one token does."""
    room = kv_cache_memory_bytes - layout.bytes_per_block

    def fits(length: int) -> bool:
        return layout.bytes_per_block * layout.max_blocks_per_request(length) <= room

    if not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def plan(
    arch: Architecture,
    serving: Serving,
    platform: Platform,
    kv_cache_memory_bytes: int,
) -> KvPlan:
    """num_gpu_blocks, kv_cache_size_tokens and max_concurrency for a KV budget, as vLLM."""
    if kv_cache_memory_bytes <= 0:
        raise SizingError("the KV cache budget must be positive")
    layout = layout_for(arch, serving, platform)
    blocks = kv_cache_memory_bytes // layout.bytes_per_block
    need = layout.max_blocks_per_request(serving.max_model_len)
    if blocks - 1 < need:
        longest = longest_that_fits(layout, kv_cache_memory_bytes, serving.max_model_len)
        raise SizingError(
            f"{kv_cache_memory_bytes:,} B of KV make {blocks} blocks; one request of "
            f"{serving.max_model_len:,} tokens needs {need} plus the null block "
            "(vLLM refuses to start: raise the KV memory or lower --max-model-len; "
            f"the estimated maximum model length is {longest})"
        )
    conc = blocks / need
    tokens = int(conc * serving.max_model_len)
    a = layout.describe() + [
        f"block = {layout.bytes_per_block:,} B (the widest group's page)",
        f"num_gpu_blocks = {kv_cache_memory_bytes:,} // {layout.bytes_per_block:,} = {blocks}",
        f"a {serving.max_model_len:,}-token request is sized at {need} blocks "
        f"(in flight per step: {layout.in_flight_tokens:,} tokens)",
        f"max concurrency = {blocks} / {need} = {conc:.2f}x; KV cache size = "
        f"int({conc:.4f} x {serving.max_model_len:,}) = {tokens:,} tokens",
    ]
    return KvPlan(layout, blocks, serving.max_model_len, tokens, conc, kv_cache_memory_bytes, a)


def capacity_line(p: KvPlan, device: str = "GPU") -> str:
    """vLLM's startup line (`update_kv_cache_capacity`), as vLLM prints it."""
    return (
        f"{device} KV cache size: {p.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
        f"{p.max_model_len:,} tokens per request: {p.max_concurrency:.2f}x"
    )


def layout_for_engine(
    arch: Architecture,
    block_size: int,
    kv_dtype: str | None,
    num_blocks: int,
    kv_cache_memory_bytes: float | None,
    enable_prefix_caching: bool | None = None,
    ssm_state_dtype: str | None = None,
) -> KvLayout:
    """The groups of a running engine from its model and what its cache_config_info says
    (block size, dtype, blocks, memory, the state dtype vLLM resolved: "auto" or None is the
    model's), checked against those figures: a model that does not match the server is an
    error, not a silent mis-sizing."""
    state = ssm_state_dtype if ssm_state_dtype in _STATE_DTYPE_BYTES else None
    platform = Platform("server", block_size, 1, None, False, 2048, state)
    dtype = kv_dtype if kv_dtype in KV_DTYPE_BYTES else "auto"
    serving = Serving(
        max_model_len=1,
        block_size=block_size,
        kv_dtype=dtype,
        enable_prefix_caching=True if enable_prefix_caching is None else enable_prefix_caching,
    )
    layout = layout_for(arch, serving, platform)
    if kv_cache_memory_bytes and num_blocks:
        made = int(kv_cache_memory_bytes // layout.bytes_per_block)
        if made != num_blocks:
            raise SizingError(
                f"the model {arch.name} does not match the server: its layout has blocks of "
                f"{layout.bytes_per_block:,} B, which make {made} from "
                f"{kv_cache_memory_bytes:,.0f} B, but vLLM made {num_blocks}"
            )
    return layout
