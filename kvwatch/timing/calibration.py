"""A deployment's own step-time constants, fitted to what its server measured.

The published corpus fits constants for cards in general; a user's server has its own kernels,
release, drivers, host and flags. `kvwatch calibrate` turns what that server measured (the
loads of a run, each a fixed concurrency with its TPOT and TTFT) into figures, and this module
fits the step model's constants to them (`fit.py`, through `measured.py`, the same mapping the
corpus uses), then keeps only what the figures pin: a constant whose doubling moves no figure
by 2% was not measured (a server never above batch 8 says nothing of the cost per request at
256) and stays at its default, named in `not_pinned`. The calibration file records the
constants, every figure with its prediction, the fit's error, and the range of loads seen, so
a prediction outside it says so. Pure: the caller reads the server.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.sizing.archconfig import Architecture
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.sizing.presets import GpuSpec
from kvwatch.timing.fit import Bound, errors, fit, summary
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.steptime import StepConstants, StepError, StepModel

__all__ = [
    "Figure",
    "Calibration",
    "CalibrationError",
    "calibrate",
    "read_calibration",
    "calibration_from_json",
    "FORMAT",
    "SERVER_ROBUST",
]

FORMAT = "kvwatch-calibration/1"
_PIN_SHIFT = 0.02  # a constant that moves no figure by 2% when doubled is not pinned
_MAX_BYTES = 4 * 2**20
# A server's figures are slices of whatever traffic it had: a few catch a wave's prefill or a
# load moving (one 3-s slice of 18 streams read a TPOT three times its neighbours', the twin,
# 2026-12-06). Past 10% (the spread of one load run twice on shared cores) a figure's pull
# grows linearly, not squared. The run path's figures are steady states and keep least squares.
SERVER_ROBUST = 0.1


class CalibrationError(SizingError):
    """The figures cannot calibrate, or a calibration file cannot be used; one line."""


@dataclass(frozen=True)
class Figure:
    """One measured figure of a load: a stage's mean TPOT or TTFT (seconds)."""

    label: str
    load: Load
    metric: str
    value: float


@dataclass(frozen=True)
class Calibration:
    model: str
    gpu: str
    tp: int
    constants: dict[str, float]
    not_pinned: dict[str, str]
    source: str
    time_base: str  # "wall" or "the twin's simulated seconds (time scale K)"
    seen: dict[str, list[float]]  # concurrency, input_len, output_len: [lowest, highest]
    figures: list[dict[str, Any]]
    error: dict[str, float]  # median_abs, max_abs, mean of the figures' errors
    created: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    def step_constants(self) -> StepConstants:
        return StepConstants.with_overrides(self.constants)

    def step_model(self, served: str = "") -> StepModel:
        """The calibrated step model of the deployment it measured. Its layers are the served
        model's where that name resolves (a preset or a local checkpoint), else the
        calibration's own model (a checkpoint's name is kept, not its path)."""
        arch = None
        for name in dict.fromkeys(x for x in (served, self.model) if x):
            try:
                arch = resolve_model(name)
                break
            except SizingError:
                continue
        if arch is None:
            raise SizingError(
                f"neither the served model {served!r} nor the calibration's {self.model!r} is "
                "a preset or a local checkpoint kvwatch can read"
            )
        return StepModel(arch, lookup_gpu(self.gpu), tp=self.tp, constants=self.step_constants())

    def outside(self, concurrency: int, input_len: int, output_len: int) -> list[str]:
        """What a prediction for this load extrapolates beyond the loads calibrated on."""
        out = []
        for name, v in (("concurrency", concurrency), ("input_len", input_len),
                        ("output_len", output_len)):  # fmt: skip
            lo, hi = self.seen.get(name, [v, v])
            if not lo * 0.8 <= v <= hi * 1.25:
                out.append(f"{name} {v:,} is outside the {lo:,.0f}-{hi:,.0f} calibrated on")
        return out


def _candidates(arch: Architecture, gpu: GpuSpec, tp: int) -> list[Bound]:
    """What a server's figures may fit: a device without a data sheet fits its own bandwidth
    and FLOP/s; a card its efficiencies; host costs always; MoE and TP terms where present.
    In the order `_unpinned` gives an effect two constants share to the first."""
    if gpu.hbm_bytes_per_s is None or gpu.bf16_flops is None:
        out = [
            Bound("hbm_bytes_per_s", 20e9, 1e7, 1e14),
            Bound("flops", 2e11, 1e8, 1e16),
            Bound("overlap", 0.5, 0.01, 1.0),
        ]
    else:
        out = [Bound("hbm_efficiency", 0.7, 0.05, 1.0), Bound("mfu", 0.4, 0.02, 1.0)]
    out.append(Bound("kv_efficiency", 0.5, 0.02, 1.0))  # KV reads cannot outrun the weights
    if arch.moe_layers:
        out.append(Bound("moe_layer_s", 50e-6, 1e-7, 5e-3))
    if tp > 1:
        out.append(Bound("allreduce_latency_s", 20e-6, 1e-7, 1e-3))
    return out + [
        Bound("request_overhead_s", 5e-6, 1e-8, 0.05),
        Bound("step_overhead_s", 0.5e-3, 1e-6, 0.5),
    ]


def _required(gpu: GpuSpec) -> set[str]:
    """Constants the model cannot run without on this device (kept even when not pinned)."""
    return set() if gpu.hbm_bytes_per_s and gpu.bf16_flops else {"hbm_bytes_per_s", "flops"}


def calibrate(
    arch: Architecture,
    gpu: GpuSpec,
    tp: int,
    kv_dtype: str,
    figures: list[Figure],
    source: str,
    time_base: str = "wall",
    robust: float | None = None,
) -> Calibration:
    """Fit this deployment's constants to its figures; keep the ones the figures pin.
    `robust`: a soft-L1 loss of that scale (fit.fit) for figures with outliers, as a server's
    slices of traffic nobody controlled have (SERVER_ROBUST)."""
    loads = {(f.load.concurrency, f.load.input_len) for f in figures}
    if len(loads) < 2:
        raise CalibrationError(
            f"{len(loads)} usable load(s) from {source}: a calibration needs loads at two "
            "concurrencies or more (e.g. loadgen run --sweep concurrency=1,4,16)"
        )

    def model(values: dict[str, float]) -> StepModel:
        return StepModel(arch, gpu, tp=tp, kv_dtype=kv_dtype,
                         constants=StepConstants.with_overrides(values))  # fmt: skip

    def predictions(values: dict[str, float]) -> list[float]:
        m = model(values)
        return [predict(m, f.load, f.metric) for f in figures]

    measured = [f.value for f in figures]
    bounds = _candidates(arch, gpu, tp)
    try:
        first = fit(bounds, predictions, measured, max_iterations=1200, robust=robust)
    except (StepError, ValueError) as e:
        raise CalibrationError(f"cannot fit {source}: {e}") from None
    not_pinned = _unpinned(bounds, first.values, predictions, figures)
    keep = [b for b in bounds if b.name not in not_pinned or b.name in _required(gpu)]
    final = fit(keep, predictions, measured, max_iterations=1500, robust=robust) if keep else first
    values = {k: v for k, v in final.values.items() if k in {b.name for b in keep}}
    pred = predictions(values)
    errs = errors(pred, measured)
    rows = [
        {"label": f.label, "metric": f.metric, "kind": f.load.kind,
         "concurrency": f.load.concurrency, "input_len": f.load.input_len,
         "output_len": f.load.output_len, "wave": f.load.wave, **_mix(f.load),
         "measured": f.value, "predicted": p, "error": e}
        for f, p, e in zip(figures, pred, errs, strict=True)
    ]  # fmt: skip
    s = summary(errs)
    notes = [f"{k} was pushed to its bound: the figures ask for more" for k in final.at_bound]
    return Calibration(
        model=arch.name,
        gpu=gpu.name,
        tp=tp,
        constants=values,
        not_pinned=not_pinned,
        source=source,
        time_base=time_base,
        seen={k: _range(figures, k) for k in ("concurrency", "input_len", "output_len")},
        figures=rows,
        error={"median_abs": s["median_abs"], "max_abs": s["max_abs"], "mean": s["mean"]},
        notes=notes,
    )


def _mix(load: Load) -> dict[str, int]:
    """A busy span's own mix, so its figure can be predicted again from the file."""
    if load.kind != "busy_span":
        return {}
    return {"steps": load.steps, "generated": load.generated,
            "prefill_tokens": load.prefill_tokens, "prefills": load.prefills}  # fmt: skip


def _unpinned(
    bounds: list[Bound],
    fitted: dict[str, float],
    predictions: Callable[[dict[str, float]], list[float]],
    figures: list[Figure],
) -> dict[str, str]:
    """The constants these figures cannot tell: each one's effect on the figures (doubling it,
    at a plausible size) less what the constants before it in `bounds` already explain. A
    constant that moves no figure by 2% is not measured; one that moves them only as another
    does (one model's weights over the bandwidth and the fixed cost of a step both add to
    every step) cannot be told apart from it, and the first in `bounds` keeps the effect."""
    columns: list[tuple[str, list[float]]] = []  # the pinned ones, orthogonalised
    out: dict[str, str] = {}
    seen = (
        f"loads seen: {_span(figures, 'concurrency')} streams, prompts of "
        f"{_span(figures, 'input_len')} tokens"
    )
    for b in bounds:
        # at a plausible size (its start), not at the fit's value: a constant the fit pushed
        # to a bound moves nothing there, yet the figures may well say what it is
        size = max(fitted[b.name], b.start)
        at = {**fitted, b.name: size}
        base = predictions(at)
        shifted = predictions({**at, b.name: size * 2 if b.name != "overlap" else size / 2})
        col = [math.log(x / y) for x, y in zip(shifted, base, strict=True)]
        if max(map(abs, col)) < _PIN_SHIFT:
            out[b.name] = f"doubling it moves no figure by {_PIN_SHIFT:.0%} ({seen})"
            continue
        rest = list(col)
        for _, q in columns:
            dot = sum(x * y for x, y in zip(rest, q, strict=True))
            rest = [x - dot * y for x, y in zip(rest, q, strict=True)]
        if max(map(abs, rest)) < _PIN_SHIFT:
            like = max(
                columns, key=lambda c: abs(sum(x * y for x, y in zip(col, c[1], strict=True)))
            )[0]
            out[b.name] = f"it moves the figures as {like} does ({seen}); {like} takes both"
            continue
        norm = math.sqrt(sum(x * x for x in rest))
        columns.append((b.name, [x / norm for x in rest]))
    return out


def _range(figures: list[Figure], name: str) -> list[float]:
    vals = [float(getattr(f.load, name)) for f in figures]
    return [min(vals), max(vals)]


def _span(figures: list[Figure], name: str) -> str:
    lo, hi = _range(figures, name)
    return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}-{hi:,.0f}"


def read_calibration(path: Path) -> Calibration:
    """A calibration file, checked where it enters: CalibrationError (one line) for anything
    that is not one, or whose constants the step model refuses."""
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise CalibrationError(f"{path}: over {_MAX_BYTES // 2**20} MiB, not a calibration")
        doc = json.loads(path.read_text())
    except OSError as e:
        raise CalibrationError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError):
        raise CalibrationError(f"{path} is not JSON") from None
    return calibration_from_json(doc, str(path))


def calibration_from_json(doc: Any, label: str) -> Calibration:
    """A parsed calibration document, checked field by field (`label` names it in errors)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f"{label} is not a kvwatch calibration (format {FORMAT})")
    try:
        consts = doc["constants"]
        if not isinstance(consts, dict) or not all(isinstance(k, str) for k in consts):
            raise TypeError("constants")
        seen: dict[str, list[float]] = {}
        for k, v in dict(doc.get("seen") or {}).items():
            if k in ("concurrency", "input_len", "output_len"):
                lo, hi = float(v[0]), float(v[1])
                if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
                    raise ValueError("seen")
                seen[k] = [lo, hi]
        cal = Calibration(
            model=_text(doc["model"]),
            gpu=_text(doc["gpu"]),
            tp=_positive_int(doc["tp"]),
            constants=consts,
            not_pinned={str(k): str(v) for k, v in dict(doc.get("not_pinned") or {}).items()},
            source=_text(doc.get("source", "")),
            time_base=_text(doc.get("time_base", "wall")),
            seen=seen,
            figures=[x for x in list(doc.get("figures") or []) if isinstance(x, dict)],
            error={str(k): float(v) for k, v in dict(doc.get("error") or {}).items()},
            created=_text(doc.get("created", "")),
            notes=[str(x) for x in list(doc.get("notes") or [])],
        )
        cal.step_constants()
    except StepError as e:
        raise CalibrationError(f"{label}: {_text(str(e))[:240]}") from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
        raise CalibrationError(f"{label}: not a usable calibration ({type(e).__name__})") from None
    return cal


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("text")
    return v.replace("\n", " ")[:500]


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError("tp")
    return v
