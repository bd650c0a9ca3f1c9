"""How long one engine step takes on a card: a stated model, every constant named and sourced.

A step runs the dense part of the model (attention, dense MLPs, embeddings, shared experts) and,
for MoE models, the routed experts, one after the other; each part is memory-bound or
compute-bound, whichever is slower. Around them: a fixed cost per MoE layer, the TP group's
all-reduces, and host costs per step and per scheduled request:

- dense part, memory: its weights read once per step plus the KV each scheduled request reads
  (full attention: its whole context; a sliding window: at most the window; chunked local
  attention: its current chunk; MLA: the latent; Mamba/GDN: its fixed state), at the card's HBM
  bandwidth x `hbm_efficiency` (KV reads x `kv_efficiency` of that: paged attention over a long
  context runs below the bandwidth weight GEMMs reach);
- dense part, compute: 2 FLOPs per active non-expert parameter per token plus attention's
  4 x heads x head size FLOPs per token per context position, at the card's peak for the
  weights' dtype (bf16, fp8 where the card computes in it) x `mfu`;
- experts: the experts this step's tokens route to (out of all of them) at the same bandwidth
  x `moe_hbm_factor` (grouped GEMMs at a few tokens per expert run below it), or their FLOPs at
  `mfu` x `moe_mfu_factor`; plus `moe_layer_s` for each MoE layer (routing, permute, combine,
  the grouped GEMMs' fixed cost), which no bandwidth hides at small batch;
- TP: each rank holds 1/TP of the weights, heads and FLOPs; two all-reduces of the hidden state
  per layer, each `allreduce_latency_s` (at TP 2) x (1 + `allreduce_growth` x (TP - 2)) plus
  2(TP-1)/TP of the bytes over the card's link;
- PP: one stage's layers per step (batches pipelined); the pipeline bubble is not simulated.

Peaks and bandwidths are the vendors' data sheets (`kvwatch/sizing/presets.py`); the constants
are fitted to a corpus of public real-GPU vLLM measurements (`bench/corpus/steptime.jsonl`,
fitted and held-out parts reported apart by `bench/bench_steptime_corpus.py`, docs/twin.md);
`--step NAME=VALUE` overrides any. It aims at vLLM's V1 engine with CUDA graphs (0.10 and
later); the corpus reaches back to 0.5, and docs/twin.md says where that shows. Pure arithmetic.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

from kvwatch.sizing.archconfig import Architecture, AttentionLayer, MlaLayer, StateLayer
from kvwatch.sizing.kvplan import KV_DTYPE_BYTES
from kvwatch.sizing.presets import LINK_BYTES_PER_S, PEER_LINK_BYTES_PER_S, GpuSpec

__all__ = [
    "StepConstants",
    "StepModel",
    "ScheduledRequest",
    "CARD_CONSTANTS",
    "StepError",
    "STANDS_FOR",
    "touched_share",
]


# the release the model and its constants stand for, as the what-if and the twin say it: the
# corpus's older figures (0.5 to 0.9) are fitted too, but the MoE kernels and the scheduler
# changed since, and a figure from those releases reads slower than this model (docs/twin.md)
STANDS_FOR = "vLLM's V1 engine with CUDA graphs, 0.10 and later"


class StepError(ValueError):
    """The step model cannot be built for this model and card; the message says why."""


# Per-card constants where one number does not hold across cards, fitted to the corpus's fit
# part (bench/bench_steptime_corpus.py fit, 2026-12-06; docs/twin.md): HBM efficiency, the
# all-reduce at TP 2, and the fixed cost of a MoE layer, which is the card's MoE kernels *and*
# the release's: `moe_layer_s` is V1's (0.8 and later), `moe_layer_v0_s` a V0 release's where
# the corpus measured one apart (`fit --only moe_layer`, the other constants as shipped).
# H200's figures are all DeepSeek-R1 on 0.7.x nightlies: its V1 cost is H100's (the same
# Hopper kernels); A100's are all V0 (Mixtral, 2024), which stand for V1 until measured.
# H200's HBM efficiency is H100's x 0.83 (the measured H200/H100 speedup, 1.19x, over the
# bandwidth ratio, 1.43x): every H200 figure is one model at TP 8, which cannot pin it apart
# from the MoE cost. `mfu` is the earlier fit to Lambda's prefills. B200 and the cards without
# a row: assumptions (H100's), until measured.
CARD_CONSTANTS: dict[str, dict[str, float]] = {
    "h100": {"hbm_efficiency": 0.81, "mfu": 0.36, "allreduce_latency_s": 10.3e-6,
             "moe_layer_s": 13e-6, "moe_layer_v0_s": 116e-6},
    "h200": {"hbm_efficiency": 0.67, "mfu": 0.36, "allreduce_latency_s": 2.8e-6,
             "moe_layer_s": 13e-6, "moe_layer_v0_s": 447e-6},
    "a100": {"hbm_efficiency": 0.69, "mfu": 0.55, "allreduce_latency_s": 13.9e-6,
             "moe_layer_s": 68e-6},
    "a100-40gb": {"hbm_efficiency": 0.69, "mfu": 0.55, "allreduce_latency_s": 13.9e-6,
                  "moe_layer_s": 68e-6},
    "mi300x": {"hbm_efficiency": 0.39, "mfu": 0.30, "allreduce_latency_s": 5.5e-6,
               "moe_layer_s": 121e-6, "moe_layer_v0_s": 471e-6},
}  # fmt: skip
_CARD_OTHER = {"hbm_efficiency": 0.81, "mfu": 0.45, "allreduce_latency_s": 10.3e-6,
               "moe_layer_s": 13e-6}  # fmt: skip


@dataclass(frozen=True)
class StepConstants:
    """The model's free constants; `--step NAME=VALUE` overrides any.
    None: the card's (CARD_CONSTANTS), or the data sheet's peak. Defaults without a card
    are fitted to the corpus's fit part with the card constants (docs/twin.md)."""

    # share of the HBM bandwidth the weights' reads reach; None: the card's
    hbm_efficiency: float | None = None
    # share of that a decode's KV reads reach (paged attention over the context)
    kv_efficiency: float = 0.60
    # share of the dense peak a prefill reaches; None: the card's
    mfu: float | None = None
    # the routed experts' bandwidth and FLOP/s against the dense part's: above 1 for the
    # bandwidth, as a step touches fewer experts than uniform routing would (routing is
    # skewed); far below 1 for FLOP/s, as grouped GEMMs at a few hundred tokens per expert run
    # below the dense GEMMs' share of the peak
    moe_hbm_factor: float = 1.14
    moe_mfu_factor: float = 0.23
    # fixed cost of one MoE layer in a step, seconds; None: the card's
    moe_layer_s: float | None = None
    # the same on a release before V1 (0.8), whose MoE kernels were slower where measured
    # apart; None: the card's V0 figure, else moe_layer_s
    moe_layer_v0_s: float | None = None
    # what every step costs beside the roofline: sampling, launch gaps, the step's host work
    # that CUDA graphs do not hide, seconds
    step_overhead_s: float = 0.0002
    # host work per scheduled request in a step (input preparation, sampling), seconds
    request_overhead_s: float = 2.8e-6
    # share of the shorter of a part's memory and compute time hidden under the longer: 1 on
    # a GPU (the roofline's max); a CPU server overlaps less (a calibration fits it)
    overlap: float = 1.0
    # one all-reduce's fixed cost inside a TP group of 2, seconds; None: the card's
    allreduce_latency_s: float | None = None
    # its growth per rank beyond 2 (the 2(TP-1) steps of a ring, partly overlapped)
    allreduce_growth: float = 0.64
    # the device's bandwidth and FLOP/s where no data sheet stands (a CPU server's, from a
    # measured figure), bytes/s and FLOP/s
    hbm_bytes_per_s: float | None = None
    flops: float | None = None

    @classmethod
    def with_overrides(cls, overrides: dict[str, float]) -> StepConstants:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise StepError(
                f"unknown step-time constants: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(names))}"
            )
        bad = [
            k
            for k, v in overrides.items()
            if isinstance(v, bool) or not (isinstance(v, int | float) and 0 <= v < float("inf"))
        ]
        if bad:
            raise StepError(
                f"step-time constants must be finite non-negative numbers: {', '.join(bad)}"
            )
        zero = [k for k in _POSITIVE if overrides.get(k, 1) == 0]
        if zero:
            raise StepError(f"{', '.join(zero)} must be above 0")
        if overrides.get("overlap", 0) > 1:
            raise StepError("overlap is a share: at most 1")
        return replace(cls(), **{k: float(v) for k, v in overrides.items()})


_POSITIVE = (
    "hbm_efficiency",
    "kv_efficiency",
    "mfu",
    "moe_hbm_factor",
    "moe_mfu_factor",
    "hbm_bytes_per_s",
    "flops",
)


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in a step: the tokens it computes now, and its context once they are in."""

    new_tokens: int
    context: int


@dataclass(frozen=True)
class _KvGroup:
    """Layers that read the same span of a request's context, summed (one rank, one stage)."""

    bytes_per_token: float  # K and V (or latent) per token
    window: int | None  # sliding window; None: the whole context
    chunk: int | None  # chunked local attention's chunk
    state_bytes: float  # recurrent-state layers: fixed bytes per request
    attn_flops_per_pos: float  # per new token per context position


@dataclass(frozen=True)
class StepModel:
    arch: Architecture
    gpu: GpuSpec
    tp: int = 1
    pp: int = 1
    kv_dtype: str = "auto"
    constants: StepConstants = StepConstants()
    # the model stands for V1 (0.8 and later); the corpus's older figures, or `advise
    # --what-if --vllm-version` below 0.8, ask for a V0 release's MoE layer cost
    before_v1: bool = False

    def __post_init__(self) -> None:
        c = self.constants
        if (self.gpu.hbm_bytes_per_s is None and c.hbm_bytes_per_s is None) or (
            self.gpu.bf16_flops is None and c.flops is None
        ):
            raise StepError(
                f"{self.gpu.name} has no bandwidth or FLOP/s figure to simulate; give the "
                "device's own as step constants hbm_bytes_per_s and flops"
            )
        if self.tp < 1 or self.pp < 1:
            raise StepError("tp and pp must be at least 1")

    def _card(self, name: str) -> float:
        given = getattr(self.constants, name)
        if given is not None:
            return float(given)
        return CARD_CONSTANTS.get(self.gpu.name, _CARD_OTHER)[name]

    @property
    def mfu(self) -> float:
        return self._card("mfu")

    @property
    def moe_layer_s(self) -> float:
        """A MoE layer's fixed cost in a step, for the release the model stands for."""
        if self.before_v1 and self.measured_v0_moe:
            return self._card("moe_layer_v0_s")
        return self._card("moe_layer_s")

    @property
    def measured_v0_moe(self) -> bool:
        """Whether a V0 release's MoE layer cost stands apart here (given, or the card's)."""
        given = self.constants.moe_layer_v0_s is not None
        return given or "moe_layer_v0_s" in CARD_CONSTANTS.get(self.gpu.name, _CARD_OTHER)

    @property
    def hbm_efficiency(self) -> float:
        return self._card("hbm_efficiency")

    @property
    def allreduce_latency_s(self) -> float:
        """One all-reduce's fixed cost at this TP size."""
        return self._card("allreduce_latency_s") * (
            1 + self.constants.allreduce_growth * max(0, self.tp - 2)
        )

    @property
    def bandwidth(self) -> float:
        """Bytes/s the weights' reads reach."""
        peak = self.constants.hbm_bytes_per_s or self.gpu.hbm_bytes_per_s
        assert peak is not None  # __post_init__
        return peak * self.hbm_efficiency

    @property
    def peak_flops(self) -> float:
        """The dense peak for the weights' dtype: fp8 checkpoints on cards that compute in
        fp8, fp4 ones on cards that compute in fp4, bf16 otherwise."""
        if self.constants.flops is not None:
            return self.constants.flops
        g, wbytes = self.gpu, self.arch.weight_bytes_per_param
        if wbytes < 1 and g.fp4_flops:
            return g.fp4_flops
        if wbytes <= 1 and g.fp8_flops:
            return g.fp8_flops
        assert g.bf16_flops is not None  # __post_init__
        return g.bf16_flops

    @cached_property
    def _kv_groups(self) -> tuple[_KvGroup, ...]:
        """Computed once: a step adds one term per group and request, not one per layer
        (a 126-layer model at 256 requests would cost this machine's engine ms a step)."""
        dtype = KV_DTYPE_BYTES.get(self.kv_dtype) or self.arch.dtype_bytes
        heads_rank = max(1, self.arch.attention_heads // self.tp)
        layers = [x for x in self.arch.layers if x is not None]
        if self.pp > 1:  # one stage's share of the layers
            layers = layers[: max(1, -(-len(layers) // self.pp))]
        sums: dict[tuple[int | None, int | None, bool], list[float]] = {}
        for layer in layers:
            per_tok = state = flops = 0.0
            window = chunk = None
            if isinstance(layer, AttentionLayer):
                kv_heads = max(1, layer.kv_heads // self.tp)
                per_tok = kv_heads * (layer.head_size + layer.head_size_v) * dtype
                flops = 2 * heads_rank * (layer.head_size + layer.head_size_v)
                window = layer.window if layer.kind == "sliding" else None
                chunk = layer.window if layer.kind == "chunked" else None
            elif isinstance(layer, MlaLayer):
                # the latent is not split across ranks; heads are
                per_tok = layer.latent * dtype
                flops = 2 * heads_rank * (layer.qk_head_dim + layer.v_head_dim)
            elif isinstance(layer, StateLayer):
                conv, ssm = layer.shapes(self.tp)
                state = conv * self.arch.dtype_bytes + ssm * 4
            acc = sums.setdefault((window, chunk, isinstance(layer, StateLayer)), [0.0, 0.0, 0.0])
            acc[0] += per_tok
            acc[1] += state
            acc[2] += flops
        return tuple(
            _KvGroup(v[0], window, chunk, v[1], v[2]) for (window, chunk, _), v in sums.items()
        )

    @cached_property
    def _params_split(self) -> tuple[float, float]:
        """(parameters outside the routed experts, all routed experts' parameters), whole model.

        With `active = shared + experts_all x k/E`: experts_all = (total - active) / (1 - k/E)."""
        a = self.arch
        if a.params_active >= a.params_total:
            return a.params_total, 0.0
        share = _routed_share(a)
        experts_all = (a.params_total - a.params_active) / (1 - share)
        return a.params_total - experts_all, experts_all

    def _weights_read(self, tokens: int) -> float:
        """Bytes of weights one rank reads for a step of `tokens` tokens."""
        shared, experts = self._params_split
        return (shared + experts * self._touched(tokens)) * self._per_rank_bytes()

    def _per_rank_bytes(self) -> float:
        return self.arch.weight_bytes_per_param / (self.tp * self.pp)

    def _touched(self, tokens: int) -> float:
        """Share of the routed experts a step of T tokens reads in each MoE layer: each token
        routes to k of E, so 1 - (1 - k/E)^T of them; all of them at T = 0 (a description)."""
        if tokens <= 0:
            return 1.0
        return touched_share(tokens, _routed_share(self.arch))

    def seconds(self, batch: list[ScheduledRequest]) -> float:
        """Simulated seconds of one step that computes `batch` (before the time scale)."""
        if not batch:
            return 0.0
        c, a = self.constants, self.arch
        tokens = sum(r.new_tokens for r in batch)
        kv_bytes = attn_flops = 0.0
        groups = self._kv_groups
        for r, n in Counter(batch).items():  # a decode batch repeats a few shapes
            start = max(0, r.context - r.new_tokens)
            for g in groups:
                if g.state_bytes:
                    kv_bytes += n * g.state_bytes
                    continue
                span = _span(r.context, g)
                kv_bytes += n * span * g.bytes_per_token
                # causal: the i-th new token sees start + i positions (capped by the window)
                mean_seen = min(span, (start + r.context + 1) / 2)
                attn_flops += n * r.new_tokens * mean_seen * g.attn_flops_per_pos
        bw, peak = self.bandwidth, self.peak_flops * self.mfu
        ranks = self.tp * self.pp
        shared, experts = self._params_split
        routed = experts * _routed_share(a) if experts else 0.0  # active expert parameters
        dense_mem = shared * self._per_rank_bytes() / bw + kv_bytes / (bw * c.kv_efficiency)
        dense_compute = (2 * (a.params_active - routed) * tokens / ranks + attn_flops) / peak
        step = self._roof(dense_mem, dense_compute)
        if experts:
            expert_mem = experts * self._touched(tokens) * self._per_rank_bytes()
            expert_flops = 2 * routed * tokens / ranks
            step += self._roof(
                expert_mem / (bw * c.moe_hbm_factor), expert_flops / (peak * c.moe_mfu_factor)
            )
            step += self.moe_layer_s * a.moe_layers / self.pp
        if self.tp > 1:
            link = PEER_LINK_BYTES_PER_S.get(self.gpu.name, LINK_BYTES_PER_S["pcie4"])
            n_layers = max(1, len(a.layers) // self.pp)
            payload = tokens * a.hidden_size * 2
            per = self.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * payload / link
            step += 2 * n_layers * per
        return step + c.step_overhead_s + c.request_overhead_s * len(batch)

    def _roof(self, memory_s: float, compute_s: float) -> float:
        """The slower of the two, plus what of the faster does not overlap it."""
        return max(memory_s, compute_s) + (1 - self.constants.overlap) * min(memory_s, compute_s)

    def describe(self) -> dict[str, Any]:
        """The constants and the figures they act on, for the startup line and docs."""
        gpu = self.gpu
        return {
            "gpu": gpu.name,
            "hbm_bytes_per_s": self.constants.hbm_bytes_per_s or gpu.hbm_bytes_per_s,
            "peak_flops": self.peak_flops,
            "link_bytes_per_s": PEER_LINK_BYTES_PER_S.get(gpu.name) if self.tp > 1 else None,
            "tp": self.tp,
            "pp": self.pp,
            "weights_bytes_per_rank": self._weights_read(0),
            **{f.name: getattr(self.constants, f.name) for f in fields(self.constants)},
            "hbm_efficiency": self.hbm_efficiency,
            "mfu": self.mfu,
            "allreduce_latency_s": self._card("allreduce_latency_s"),
            "moe_layer_s": self.moe_layer_s,
            "before_v1": self.before_v1,
        }


def touched_share(tokens: float, routed_share: float) -> float:
    """Share of a MoE layer's routed experts that `tokens` tokens read, each routing to k of
    E (`routed_share` k/E): 1 - (1 - k/E)^T, 0 for no tokens or a dense model. The sidecar's
    load forecast bends its step curve by it (sidecar/judge/load_forecast.py)."""
    if not tokens > 0 or not routed_share > 0:  # NaN too
        return 0.0
    if routed_share >= 1:  # every token reads every expert (a config can say more than all)
        return 1.0
    return 1 - float((1 - routed_share) ** tokens)


def _routed_share(a: Architecture) -> float:
    """k/E of a MoE model; where the config does not say, active over total parameters."""
    return a.moe_routed_share or min(0.5, a.params_active / a.params_total)


def _span(context: int, layer: _KvGroup) -> int:
    if layer.window is not None:
        return min(context, layer.window)
    if layer.chunk is not None:
        return (context - 1) % layer.chunk + 1 if context else 0
    return context
