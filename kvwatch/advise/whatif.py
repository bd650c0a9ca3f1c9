"""`kvwatch advise --what-if`: vLLM's KV figures for a model, GPU and settings not deployed yet.

The plan is vLLM's own arithmetic (`kvplan`, checked against vLLM in tests/sizing): with
`--kv-cache-memory-bytes` it is exact; from `--gpu-memory-utilization` the budget is the GPU's
memory share less the weights and an estimated activation peak per GPU (`sizing/budget.py`,
which the twin shares), which leaves out CUDA graphs (it says so). A load (`--prompt-len`,
`--output-len`, and `--concurrency` streams) adds the load's KV onset and tokens/s
(`timing/loadmodel.py`, with the twin's step model), the sizing advice, and what one preemption
costs on that model.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.sizing.advice import Observed, byte_size
from kvwatch.sizing.archconfig import Architecture
from kvwatch.sizing.budget import default_max_num_seqs, given_kv_bytes, utilization_budget
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import Gpu, VictimCosts, lookup_gpu, resolve_model, victim_costs
from kvwatch.sizing.kvplan import PLATFORMS, KvPlan, Serving, capacity_line, plan
from kvwatch.sizing.levers import parse_version
from kvwatch.timing.calibration import Calibration, read_calibration
from kvwatch.timing.loadmodel import ClosedLoop, LoadPrediction, predict_closed_loop
from kvwatch.timing.steptime import STANDS_FOR, StepConstants, StepError, StepModel

__all__ = ["WhatIfAnswer", "what_if", "render_what_if"]

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's default since 0.20


@dataclass(frozen=True)
class WhatIfAnswer:
    model: Architecture
    gpu: Gpu
    serving: Serving
    plan: KvPlan
    budget: str  # how the KV budget was found
    weights_bytes_per_gpu: float
    observed: Observed | None
    costs: VictimCosts | None
    load: LoadPrediction | None = None
    step_source: str = f"the step model's corpus fit, for {STANDS_FOR} (docs/twin.md)"
    step_notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        par = f"TP{self.serving.tp}" + (f" PP{self.serving.pp}" if self.serving.pp > 1 else "")
        return f"what-if {self.model.name} on {self.gpu.name} {par}"

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        device = "CPU" if PLATFORMS[self.gpu.platform].is_cpu else "GPU"
        return {
            "model": self.model.name,
            "architecture": self.model.architecture,
            "layers": self.model.kinds(),
            "layers_source": self.model.layers_source,
            "gpu": self.gpu.name,
            "platform": self.gpu.platform,
            "serving": asdict(self.serving),
            "num_gpu_blocks": p.num_gpu_blocks,
            "block_size": p.layout.block_size,
            "kv_cache_size_tokens": p.kv_cache_size_tokens,
            "max_concurrency": p.max_concurrency,
            "decode_concurrency": p.decode_concurrency,
            "capacity_line": capacity_line(p, device),
            "bytes_per_block": p.layout.bytes_per_block,
            "kv_bytes_per_token": p.layout.bytes_per_token,
            "kv_cache_memory_bytes": p.kv_cache_memory_bytes,
            "budget": self.budget,
            "weights_bytes_per_gpu": self.weights_bytes_per_gpu,
            "groups": [asdict(g) for g in p.layout.groups],
            "arithmetic": p.arithmetic,
            "notes": list(self.model.notes) + list(p.layout.notes),
            "params_total": self.model.params_total,
            "params_active": self.model.params_active,
            "victim": None if self.costs is None else self.costs.to_dict(),
            "load": None if self.load is None else self.load.to_dict(),
            "step_time_source": self.step_source,
            "step_time_notes": list(self.step_notes),
        }


def what_if(ns: argparse.Namespace) -> WhatIfAnswer:
    if not ns.model:
        raise SizingError("a what-if needs --model (a preset like llama-3.1-8b, or a config.json)")
    if not ns.gpu:
        raise SizingError("a what-if needs --gpu (h100, h200, b200, a100, ..., or cpu)")
    model, gpu = resolve_model(ns.model, ns.layers), lookup_gpu(ns.gpu)
    max_len = ns.max_model_len or model.max_position_embeddings
    if not max_len:
        raise SizingError(
            f"{model.name}: the config names no max_position_embeddings; give --max-model-len"
        )
    serving = Serving(
        max_model_len=max_len,
        block_size=ns.block_size,
        kv_dtype=ns.kv_dtype,
        tp=ns.tp,
        pp=ns.pp,
        max_num_batched_tokens=ns.max_num_batched_tokens
        or gpu.batched_tokens * (ns.tp * ns.pp if PLATFORMS[gpu.platform].is_cpu else 1),
        enable_prefix_caching=not ns.no_prefix_caching,
    )
    weights = model.weight_bytes / (ns.tp * ns.pp)
    if ns.kv_cache_memory_bytes is not None:
        budget = given_kv_bytes(int(ns.kv_cache_memory_bytes), gpu)
        how = "--kv-cache-memory-bytes (exact)"
    else:
        b = utilization_budget(
            model,
            gpu,
            ns.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
            ns.tp,
            ns.pp,
            serving.max_num_batched_tokens or gpu.batched_tokens,
            default_max_num_seqs(gpu),
        )
        budget, how = b.kv_bytes, b.how
    p = plan(model, serving, PLATFORMS[gpu.platform], budget)
    load = (ns.concurrency, ns.prompt_len, ns.output_len)
    obs = costs = load_prediction = None
    cal, step_source, step_notes = _calibrated(ns, model, gpu)
    if any(x is not None for x in load):
        if any(x is None for x in load):
            raise SizingError("a load needs all of --concurrency, --prompt-len and --output-len")
        if min(x or 0 for x in load) < 0:
            raise SizingError("concurrency and lengths must not be negative")
        seq = ns.prompt_len + ns.output_len
        obs = Observed(
            capacity_blocks=p.num_gpu_blocks,
            block_size=p.layout.block_size,
            kv_bytes_per_token=p.layout.bytes_per_token or 1.0,
            peak_demand=ns.concurrency,
            seq_len_p95=seq,
            seq_len_max=seq,
            gpu_memory_utilization=None
            if ns.kv_cache_memory_bytes
            else (ns.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION),
            kv_cache_memory_bytes=budget,
            kv_dtype=ns.kv_dtype,
            source=f"what-if {model.name} on {gpu.name}",
            layout=p.layout,
        )
        if ns.max_num_seqs is not None and ns.max_num_seqs < 1:
            raise SizingError("--max-num-seqs must be at least 1")
        closed = ClosedLoop(
            max(1, math.ceil(ns.concurrency)),
            max(1, math.ceil(ns.prompt_len)),
            max(1, math.ceil(ns.output_len)),
        )
        if cal is not None:
            step_notes += cal.outside(closed.concurrency, closed.prompt_len, closed.output_len)
        steps = _step_model(
            model, gpu, ns.tp, ns.pp, ns.kv_dtype,
            None if cal is None else cal.step_constants(), _before_v1(ns),
        )  # fmt: skip
        if steps is not None and steps.before_v1 and model.moe_layers:
            step_notes.append(
                f"vLLM {ns.vllm_version} runs the V0 engine: a MoE layer's fixed cost is "
                + (f"{steps.moe_layer_s * 1e6:.0f} us, V0's on {gpu.name}"
                   if steps.measured_v0_moe
                   else f"V1's ({steps.moe_layer_s * 1e6:.0f} us): no V0 figure on {gpu.name}")
            )  # fmt: skip
        load_prediction = predict_closed_loop(
            closed,
            p.layout,
            p.num_gpu_blocks,
            serving.max_num_batched_tokens or gpu.batched_tokens,
            ns.max_num_seqs or default_max_num_seqs(gpu),
            steps,
        )
        costs = victim_costs(
            model,
            gpu,
            ns.concurrency,
            ns.victim_tokens or seq,
            layout=p.layout,
            tp=ns.tp,
            step_s=None if ns.step_ms is None else ns.step_ms / 1000,
        )
    return WhatIfAnswer(
        model, gpu, serving, p, how, weights, obs, costs, load_prediction, step_source,
        tuple(step_notes),
    )  # fmt: skip


def _calibrated(
    ns: argparse.Namespace, model: Architecture, gpu: Gpu
) -> tuple[Calibration | None, str, list[str]]:
    """`--calibration FILE`: its constants, where it says it came from, and what differs
    between the deployment it measured and the one asked about."""
    path = getattr(ns, "calibration", None)
    if path is None:
        return None, WhatIfAnswer.step_source, []
    cal = read_calibration(path)
    if cal.gpu != gpu.name:
        raise SizingError(f"{path} calibrates {cal.gpu}, not {gpu.name}; calibrate this device")
    notes = []
    if cal.tp != ns.tp:
        notes.append(
            f"calibrated at TP {cal.tp}, asked at TP {ns.tp}: the TP terms are the model's"
        )
    if cal.model != model.name:
        notes.append(f"calibrated on {cal.model}, asked for {model.name}")
    source = f"calibration {path} ({cal.source}; times: {cal.time_base})"
    return cal, source, notes


def _step_model(
    model: Architecture,
    gpu: Gpu,
    tp: int,
    pp: int,
    kv_dtype: str,
    constants: StepConstants | None = None,
    before_v1: bool = False,
) -> StepModel | None:
    """The step model for this card; None where the card has no bandwidth or FLOP/s figure
    and no calibration gives them (the CPU presets): the load's onset is still given, its
    tokens/s not."""
    try:
        return StepModel(
            model, gpu, tp=tp, pp=pp, kv_dtype=kv_dtype, constants=constants or StepConstants(),
            before_v1=before_v1,
        )  # fmt: skip
    except StepError:
        return None


def _before_v1(ns: argparse.Namespace) -> bool:
    """`--vllm-version` below 0.8, V1's first default release: the V0 engine's MoE kernels."""
    v = parse_version(getattr(ns, "vllm_version", None))
    return v is not None and v < (0, 8, 0)


def _decode_lines(p: KvPlan) -> list[str]:
    """Beside vLLM's startup concurrency, what the pool holds once every request decodes,
    where windows make the two differ (other planners print the second; users compare)."""
    held = p.decode_blocks_per_request
    startup = p.layout.max_blocks_per_request(p.max_model_len)
    if held >= startup:
        return []
    return [
        f"  once every request decodes: {p.decode_concurrency:.2f}x {p.max_model_len:,}-token "
        f"requests fit ({held:,} blocks each; vLLM's startup figure counts {startup:,}: each "
        "window also holds a prefill chunk of in-flight tokens)"
    ]


def _load_lines(x: LoadPrediction, source: str, notes: tuple[str, ...]) -> list[str]:
    """The closed loop's onset and tokens/s, each with its arithmetic."""
    c = x.load
    head = (
        f"  the load: {c.concurrency:,} streams of {c.prompt_len:,} + {c.output_len:,} tokens "
        "(a closed loop: each sends its next request when the last ends)"
    )
    if x.kv_onset_concurrency is None:
        verdict = f"    no KV onset: even {x.max_num_seqs:,} streams fit"
    elif c.concurrency >= x.kv_onset_concurrency:
        verdict = (
            f"    preempts: the KV onset is {x.kv_onset_concurrency:,} streams; "
            f"{x.fits_concurrency:,} run clean"
        )
    else:
        verdict = (
            f"    fits: preemption would start at {x.kv_onset_concurrency:,} streams (KV onset)"
        )
    lines = [head, verdict, *[f"    {t}" for t in x.arithmetic]]
    t, f = x.at_concurrency, x.at_fits
    if t is None:
        lines.append(
            "    (no bandwidth or FLOP/s figure for this device: tokens/s not given; "
            "`kvwatch calibrate` fits them from your server)"
        )
        return lines
    lines.append(
        f"    output tokens/s at {c.concurrency:,} streams: {t.output_tokens_per_s:,.0f}"
        + (" (with room; preemption's recompute costs more)" if t.preempts else "")
    )
    if f is not None and f.concurrency != c.concurrency:
        lines.append(
            f"    at {f.concurrency:,} streams, the most that run clean: "
            f"{f.output_tokens_per_s:,.0f} output tokens/s"
        )
    lines.append(f"    (step times from {source})")
    lines += [f"    note: {n}" for n in notes]
    return lines


def render_what_if(a: WhatIfAnswer) -> list[str]:
    p, m = a.plan, a.model
    kinds = ", ".join(f"{n} {k}" for k, n in m.kinds().items())
    device = "CPU" if PLATFORMS[a.gpu.platform].is_cpu else "GPU"
    lines = [
        f"  model: {m.architecture} ({kinds}; {m.params_total / 1e9:,.1f}B parameters"
        + (f", {m.params_active / 1e9:,.1f}B active" if m.params_active < m.params_total else "")
        + ")",
        f"  layers from: {m.layers_source}",
        f"  KV budget: {p.kv_cache_memory_bytes:,} B = {byte_size(p.kv_cache_memory_bytes)} "
        f"({a.budget})",
        f"  vLLM would print: {capacity_line(p, device)}",
        f"  num_gpu_blocks {p.num_gpu_blocks:,}, block_size {p.layout.block_size}",
        *_decode_lines(p),
        "  how vLLM gets there:",
        *[f"    {x}" for x in p.arithmetic],
    ]
    notes = list(m.notes) + list(p.layout.notes)
    if notes:
        lines += ["  notes:", *[f"    {x}" for x in notes]]
    if a.load is not None:
        lines += _load_lines(a.load, a.step_source, a.step_notes)
    v = a.costs
    if v is not None:
        lines += [
            "  cost of one preemption:",
            f"    {v.kv_bytes_per_token / 1024:,.0f} KiB per token, "
            f"{v.block_bytes / 2**20:,.2f} MiB per block, "
            f"{v.new_blocks_per_step:.2f} new blocks per decode step",
            f"    recompute: {v.recompute_flops / 1e12:.1f} TFLOP"
            + ("" if v.recompute_s is None else f" = {v.recompute_s * 1e3:.0f} ms at peak")
            + f" (plus {v.attention_flops / 1e12:.2f} TFLOP of attention over the context)",
            f"    swap: {v.swap_blocks} blocks = {v.swap_bytes / 2**20:,.0f} MiB"
            + ("" if v.swap_s_each_way is None else f", {v.swap_s_each_way * 1e3:.1f} ms each way"),
        ]
        if v.regenerate_s is not None and v.step_s is not None:
            how = (
                "the decode step at the memory-bandwidth roofline: "
                f"{m.params_active * m.weight_bytes_per_param / a.serving.tp / 1e9:.1f} GB of "
                f"weights per step / {(a.gpu.hbm_bytes_per_s or 0) / 1e12:.2f} TB/s"
                if v.step_source == "roofline"
                else "--step-ms"
            )
            lines.append(
                f"    generating it again: {v.regenerate_s:.1f} s "
                f"({v.step_s * 1e3:.1f} ms a step, {how})"
            )
            busy = None if a.load is None else a.load.at_concurrency
            if busy is not None and v.step_source == "roofline":
                lines.append(
                    f"    at this load's decode step ({busy.decode_step_s * 1e3:.1f} ms, the "
                    f"twin's step model): {v.regenerate_s / v.step_s * busy.decode_step_s:.1f} s"
                )
        if math.isfinite(v.new_blocks_per_step) and v.recompute_s is None:
            lines.append("    (no FLOP/s figure for this device: recompute time not given)")
    return lines
