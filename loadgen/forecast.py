"""`loadgen search --calibration FILE`: the search's forecast, from the calibration, the
server's own cache and the workload's mean lengths (kvwatch/timing/search_forecast.py says
how). A calibration in the twin's simulated seconds is put in wall time by the twin's time
scale, as the search judges the SLOs in wall time."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from kvwatch.loadgen.workload.spec import WorkloadSpec
from kvwatch.sizing.budget import default_max_num_seqs
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for
from kvwatch.timing.calibration import Calibration
from kvwatch.timing.search_forecast import forecast_search

__all__ = ["mean_lengths", "forecast_doc", "render_forecast", "forecast_line"]

_SAMPLE = 200  # requests drawn to read the workload's mean lengths


def mean_lengths(workload: WorkloadSpec) -> tuple[int, int]:
    """The mean prompt and output tokens of the workload's first requests."""
    items = list(itertools.islice(workload.items(), _SAMPLE))
    prompts = [len(x.token_ids) if x.token_ids else (x.input_tokens or 0) for x in items]
    prompts = [n for n in prompts if n > 0]
    if not prompts:
        raise SizingError("the workload's prompt lengths are not known before it is sent")
    outputs = [x.max_tokens for x in items]
    return round(sum(prompts) / len(prompts)), max(1, round(sum(outputs) / len(outputs)))


def forecast_doc(
    cal: Calibration,
    path: Path,
    cache: dict[str, Any],
    lengths: tuple[int, int],
    slo: dict[str, float],
    max_load: int,
    time_scale: float | None,
    served: str = "",
) -> dict[str, Any]:
    """The forecast as search.json's `forecast`: its figures in wall time, with what it stands
    on (calibration, cache, lengths) and what it extrapolates. The model's layers are the
    served model's where its name resolves (a preset or a local checkpoint), else the
    calibration's."""
    steps = cal.step_model(served)
    arch, gpu = steps.arch, steps.gpu
    p, o = lengths
    raw_blocks, raw_size = cache.get("num_blocks"), cache.get("block_size")
    if not (_count(raw_blocks) and _count(raw_size)):
        raise SizingError(f"the server's cache is no cache: {raw_blocks!r} blocks of {raw_size!r}")
    blocks, block_size = int(raw_blocks), int(raw_size)  # type: ignore[arg-type]
    layout = layout_for(
        arch, Serving(p + o, block_size=block_size, tp=cal.tp), PLATFORMS[gpu.platform]
    )
    # the calibration's seconds -> wall seconds, which the SLO limits are in
    scale = 1.0
    if cal.time_base != "wall":
        if time_scale is None:
            raise SizingError(
                f"the calibration is in {cal.time_base}, and the server says no time scale"
            )
        scale = time_scale
    simulated_slo = {k: v / scale for k, v in slo.items()}
    f = forecast_search(
        steps, layout, blocks, gpu.batched_tokens, default_max_num_seqs(gpu), p, o,
        simulated_slo, max_load,
    )  # fmt: skip
    at = {k: v * scale if k != "output_tok_s" else v / scale for k, v in f.at_limit.items()}
    limit = f.slo_limit or 1
    return {
        **f.to_dict(),
        "at_limit": at,
        "calibration": str(path),
        "calibration_source": cal.source,
        "num_gpu_blocks": blocks,
        "block_size": block_size,
        "prompt_len": p,
        "output_len": o,
        "outside_calibration": cal.outside(limit, p, o),
    }


def _count(v: Any) -> bool:
    """A count the server could have: a number from 2 to 10^12."""
    return isinstance(v, int | float) and not isinstance(v, bool) and 2 <= v <= 1e12


def render_forecast(doc: dict[str, Any]) -> str:
    """The forecast in a few lines, before the first probe."""
    onset = doc["kv_onset"]
    lines = [
        f"forecast from {doc['calibration']} ({doc['num_gpu_blocks']:,} blocks of "
        f"{doc['block_size']}, {doc['prompt_len']:,} + {doc['output_len']:,} tokens):",
        "  KV onset: " + (f"{onset} streams" if onset else "none up to the search's maximum"),
        "  SLO limit: " + _limit(doc),
    ]
    at = doc["at_limit"]
    if at:
        lines.append(
            f"  at the limit: TTFT {at['ttft'] * 1e3:,.0f} ms, TPOT {at['tpot'] * 1e3:,.1f} ms, "
            f"e2e {at['e2e']:,.2f} s, {at['output_tok_s']:,.0f} output tokens/s (means)"
        )
    if doc["unforecast"]:
        lines.append(f"  not forecast (the server's own): {', '.join(doc['unforecast'])}")
    lines += [f"  extrapolated: {x}" for x in doc["outside_calibration"]]
    return "\n".join(lines)


def _limit(doc: dict[str, Any]) -> str:
    limit = doc["slo_limit"]
    if not limit:
        return "none (one stream misses it)"
    if doc["binding"] == "kv":  # preemption's cost is not forecast: met up to here, at least
        return f"at least {limit} streams (binding: kv; past the onset it is not forecast)"
    return f"{limit} streams (binding: {doc['binding']})"


def forecast_line(forecast: dict[str, Any], found: dict[str, Any]) -> str:
    """The forecast beside what the probes found (search.json's result)."""

    def load(v: dict[str, Any] | None) -> str:
        return f"{v['load']:g}" if v else "none"

    return (
        f"forecast vs found: SLO limit {forecast['slo_limit'] or 'none'} vs "
        f"{load(found.get('max_ok'))} streams; KV onset {forecast['kv_onset'] or 'none'} vs "
        f"{load(found.get('kv_onset'))}"
    )
