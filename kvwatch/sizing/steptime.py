"""How long one engine step takes on the simulated card: a stated roofline, every constant named.

A step is memory-bound or compute-bound, whichever is slower, plus the TP group's all-reduces and
a fixed per-step cost:

- memory: the weights read once per step (for MoE, the experts this step's tokens route to, out
  of all of them) plus the KV each scheduled request reads (full attention: its whole context;
  a sliding window: at most the window; chunked local attention: its current chunk; MLA: the
  latent; Mamba/GDN: its fixed state), at HBM bandwidth x `hbm_efficiency`;
- compute: 2 FLOPs per active parameter per token, plus attention's 4 x heads x head size
  FLOPs per token per context position, at the dense bf16 peak x `mfu`;
- TP: each rank holds 1/TP of the weights, heads and FLOPs; two all-reduces of the hidden state
  per layer, each `allreduce_latency_s` plus 2(TP-1)/TP of the bytes over the card's link;
- PP: one stage's layers per step (batches pipelined); the pipeline bubble is not simulated.

Peaks are the vendors' data sheets (`kvwatch/sizing/presets.py`); the efficiencies are fitted
to published vLLM figures, docs/twin.md names them, and `bench/calibrate_twin.py` refits them
on a real card. Pure arithmetic.
"""

from __future__ import annotations

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
    "MFU_BY_GPU",
    "StepError",
]


class StepError(ValueError):
    """The step model cannot be built for this model and card; the message says why."""


# A prefill's share of the dense bf16 peak, fitted to Lambda's time to first token of ten prompts
# (1,369 tokens in one batch) of Llama 3 8B with vLLM 0.6.0: 62 ms on an H100 SXM, 127 ms on an
# A100 80GB (docs/twin.md). Hopper reaches a smaller share of its far higher peak at this size.
# Other cards: 0.45, an assumption until calibrated.
MFU_BY_GPU = {"h100": 0.36, "h200": 0.36, "a100": 0.55, "a100-40gb": 0.55}
_MFU_OTHER = 0.45


@dataclass(frozen=True)
class StepConstants:
    """The model's free constants; `--step NAME=VALUE` overrides any of them."""

    # share of the HBM bandwidth a decode step's weight and KV reads reach: with the overhead
    # below, fitted to Lambda's H100 SXM decode of Llama 3 8B (vLLM 0.6.0, 10-step scheduling:
    # 7.2 ms a step at up to 10 sequences); it predicts their A100 80GB's 11.45 ms to 0.1%
    # (docs/twin.md); bench/calibrate_twin.py refits it on a real card
    hbm_efficiency: float = 0.72
    # share of the dense bf16 peak a prefill reaches; None: the card's (MFU_BY_GPU)
    mfu: float | None = None
    # what every step costs beside the roofline: sampling, launch gaps, the step's host work
    # that CUDA graphs do not hide, seconds
    step_overhead_s: float = 0.0005
    # one all-reduce's fixed cost inside a TP group, seconds
    allreduce_latency_s: float = 10e-6

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
            if isinstance(v, bool) or not (isinstance(v, int | float) and v >= 0)
        ]
        if bad:
            raise StepError(f"step-time constants must be non-negative numbers: {', '.join(bad)}")
        if overrides.get("hbm_efficiency", 1) == 0 or overrides.get("mfu", 1) == 0:
            raise StepError("hbm_efficiency and mfu must be above 0")
        return replace(cls(), **{k: float(v) for k, v in overrides.items()})


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

    def __post_init__(self) -> None:
        if self.gpu.hbm_bytes_per_s is None or self.gpu.bf16_flops is None:
            raise StepError(f"{self.gpu.name} has no bandwidth or FLOP/s figure to simulate")
        if self.tp < 1 or self.pp < 1:
            raise StepError("tp and pp must be at least 1")

    @property
    def mfu(self) -> float:
        given = self.constants.mfu
        return given if given is not None else MFU_BY_GPU.get(self.gpu.name, _MFU_OTHER)

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

    def _weights_read(self, tokens: int) -> float:
        """Bytes of weights one rank reads for a step of `tokens` tokens."""
        a = self.arch
        total = a.params_total * a.weight_bytes_per_param
        if a.params_active >= a.params_total or tokens <= 0:
            return total / (self.tp * self.pp)
        # MoE: each token routes to k of E experts; with `active = shared + expert_all x k/E`
        # the expert bytes are (total - active) / (1 - k/E); a step of T tokens touches
        # 1 - (1 - k/E)^T of them in each layer
        share = _routed_share(a)
        expert_all = (a.params_total - a.params_active) / (1 - share)
        shared = a.params_total - expert_all
        touched = 1 - (1 - share) ** tokens
        return (shared + expert_all * touched) * a.weight_bytes_per_param / (self.tp * self.pp)

    def seconds(self, batch: list[ScheduledRequest]) -> float:
        """Simulated seconds of one step that computes `batch` (before the time scale)."""
        if not batch:
            return 0.0
        c, gpu = self.constants, self.gpu
        assert gpu.hbm_bytes_per_s is not None and gpu.bf16_flops is not None
        tokens = sum(r.new_tokens for r in batch)
        groups = self._kv_groups
        kv_bytes = 0.0
        attn_flops = 0.0
        for r in batch:
            start = max(0, r.context - r.new_tokens)
            for g in groups:
                if g.state_bytes:
                    kv_bytes += g.state_bytes
                    continue
                span = _span(r.context, g)
                kv_bytes += span * g.bytes_per_token
                # causal: the i-th new token sees start + i positions (capped by the window)
                mean_seen = min(span, (start + r.context + 1) / 2)
                attn_flops += r.new_tokens * mean_seen * g.attn_flops_per_pos
        weights = self._weights_read(tokens)
        memory_s = (weights + kv_bytes) / (gpu.hbm_bytes_per_s * c.hbm_efficiency)
        dense_flops = 2 * self.arch.params_active * tokens / (self.tp * self.pp)
        compute_s = (dense_flops + attn_flops) / (gpu.bf16_flops * self.mfu)
        comm_s = 0.0
        if self.tp > 1:
            link = PEER_LINK_BYTES_PER_S.get(gpu.name, LINK_BYTES_PER_S["pcie4"])
            n_layers = max(1, len(self.arch.layers) // self.pp)
            payload = tokens * self.arch.hidden_size * 2
            per = c.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * payload / link
            comm_s = 2 * n_layers * per
        return max(memory_s, compute_s) + comm_s + c.step_overhead_s

    def describe(self) -> dict[str, Any]:
        """The constants and the figures they act on, for the startup line and docs."""
        gpu = self.gpu
        return {
            "gpu": gpu.name,
            "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
            "bf16_flops": gpu.bf16_flops,
            "link_bytes_per_s": PEER_LINK_BYTES_PER_S.get(gpu.name) if self.tp > 1 else None,
            "tp": self.tp,
            "pp": self.pp,
            "weights_bytes_per_rank": self._weights_read(0),
            **{f.name: getattr(self.constants, f.name) for f in fields(self.constants)},
            "mfu": self.mfu,
        }


def _routed_share(a: Architecture) -> float:
    """k/E of a MoE model; where the config does not say, active over total parameters."""
    return a.moe_routed_share or min(0.5, a.params_active / a.params_total)


def _span(context: int, layer: _KvGroup) -> int:
    if layer.window is not None:
        return min(context, layer.window)
    if layer.chunk is not None:
        return (context - 1) % layer.chunk + 1 if context else 0
    return context
