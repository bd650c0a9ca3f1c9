"""`kvwatch advise`: sizing advice from a run directory, a live sidecar, a vLLM /metrics URL,
or figures alone (what-if). Exit 0 when the load fits, 1 when the cache is undersized."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvwatch.sidecar.advice import Advice, Observed, advise, kv_bytes_per_token_from
from kvwatch.sidecar.command import EXIT_FOUND, EXIT_UNREACHABLE, CliError
from kvwatch.sidecar.kvmath import (
    Gpu,
    ModelShape,
    SizingError,
    block_bytes,
    kv_bytes_per_token,
    lookup_gpu,
    lookup_model,
    model_from_config,
    victim_costs,
)
from kvwatch.sidecar.views import EngineView, engines_from_json

__all__ = ["run_advise", "observed_from_engines"]


def observed_from_engines(
    engines: Sequence[tuple[str, EngineView]], source: str
) -> list[tuple[str, Observed]]:
    """One Observed per engine a sidecar sees (its own state, or another's /api/state)."""
    out = []
    for target, e in engines:
        s = e.signals
        name = f"{target} {e.model_name} engine {e.engine}"
        if not s.capacity_blocks or not s.block_size:
            raise SizingError(f"{name}: capacity unknown (no cache_config_info)")
        mem = s.kv_cache_memory_bytes
        bpt = kv_bytes_per_token_from(mem, s.capacity_blocks, s.block_size, source)
        p95 = (s.prompt_len_p95 or 0) + (s.output_len_p95 or 0)
        if not p95:
            raise SizingError(f"{name}: no finished requests yet, so no request lengths")
        out.append(
            (
                name,
                Observed(
                    capacity_blocks=s.capacity_blocks,
                    block_size=s.block_size,
                    kv_bytes_per_token=bpt,
                    peak_demand=s.peak_demand_long or 0,
                    seq_len_p95=p95,
                    seq_len_max=p95,
                    preemptions=s.preemptions_observed or 0,
                    gpu_memory_utilization=s.gpu_memory_utilization,
                    kv_cache_memory_bytes=mem,
                    kv_dtype=s.cache_dtype or "auto",
                    source=source,
                ),
            )
        )
    if not out:
        raise SizingError(f"{source}: no vLLM engine seen")
    return out


async def _watch_metrics(url: str, seconds: float) -> list[tuple[str, EngineView]]:
    import httpx

    from kvwatch.sidecar.scrape import metrics_url, scrape_once
    from kvwatch.sidecar.state import SidecarState
    from kvwatch.sidecar.thresholds import Thresholds

    state = SidecarState([url], Thresholds(long_window_s=seconds + 5))
    async with httpx.AsyncClient() as client:
        end = time.monotonic() + seconds
        while True:
            out = await scrape_once(client, metrics_url(url), 5.0)
            state.record_scrape(url, time.monotonic(), out)
            if out.exposition is None:
                raise CliError(f"cannot scrape {url}: {out.error}", EXIT_UNREACHABLE)
            if time.monotonic() >= end:
                return [(t.target, e) for t in state.view().targets for e in t.engines]
            await asyncio.sleep(1.0)


def _model(ns: argparse.Namespace) -> ModelShape:
    if not ns.model:
        raise SizingError("give --model (a preset like llama-3.1-8b, or a config.json)")
    p = Path(ns.model)
    return model_from_config(p) if p.exists() else lookup_model(ns.model)


def _what_if(ns: argparse.Namespace) -> tuple[Observed, dict[str, Any], Gpu]:
    missing = [
        f for f in ("gpu", "concurrency", "prompt_len", "output_len") if getattr(ns, f) is None
    ]
    if missing:
        raise SizingError(
            "a what-if needs " + ", ".join("--" + m.replace("_", "-") for m in missing)
        )
    model, gpu = _model(ns), lookup_gpu(ns.gpu)
    if ns.concurrency < 0 or ns.prompt_len < 0 or ns.output_len < 0:
        raise SizingError("concurrency and lengths must not be negative")
    if not 0 < ns.gpu_memory_utilization <= 1:
        raise SizingError("--gpu-memory-utilization must be in (0, 1]")
    bpt = kv_bytes_per_token(model, ns.kv_dtype, ns.tp)
    weights = model.params * 2 / ns.tp
    kv_mem = gpu.memory_bytes * ns.gpu_memory_utilization - weights
    if kv_mem <= 0:
        raise SizingError(
            f"{model.name} weights ({weights / 1e9:.0f} GB per GPU) do not fit in "
            f"{ns.gpu_memory_utilization:g} x {gpu.memory_bytes / 1e9:.0f} GB; "
            "raise --tp"
        )
    blocks = int(kv_mem // block_bytes(bpt, ns.block_size))
    seq = ns.prompt_len + ns.output_len
    obs = Observed(
        capacity_blocks=blocks,
        block_size=ns.block_size,
        kv_bytes_per_token=bpt,
        peak_demand=ns.concurrency,
        seq_len_p95=seq,
        seq_len_max=seq,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_mem,
        kv_dtype=ns.kv_dtype,
        source=f"what-if {model.name} on {ns.tp}x {gpu.name}",
    )
    costs = victim_costs(
        model,
        gpu,
        ns.concurrency,
        ns.victim_tokens or seq,
        ns.block_size,
        ns.kv_dtype,
        ns.tp,
        None if ns.step_ms is None else ns.step_ms / 1000,
    )
    extra = {
        "model": model.name,
        "gpu": gpu.name,
        "tp": ns.tp,
        "kv_dtype": ns.kv_dtype,
        "weights_bytes_per_gpu": weights,
        "kv_memory_bytes": kv_mem,
        "assumption": "KV memory = GPU memory x utilization - bf16 weights; activations and "
        "CUDA graphs take a little more in practice",
        "victim": costs.to_dict(),
    }
    return obs, extra, gpu


def _render(name: str, obs: Observed, adv: Advice, extra: dict[str, Any] | None) -> str:
    lines = [f"{name}: {adv.verdict}"]
    if obs.preemptions:
        lines.append(f"  preemptions observed: {obs.preemptions:,.0f}")
    lines += ["  arithmetic:"] + [f"    {x}" for x in adv.arithmetic]
    if adv.options:
        lines += ["  change one of:"] + [f"    {x}" for x in adv.options]
    if extra and "victim" in extra:
        v = extra["victim"]
        lines += [
            "  cost of one preemption:",
            f"    {v['kv_bytes_per_token'] / 1024:,.0f} KiB per token, "
            f"{v['block_bytes'] / 2**20:,.2f} MiB per block, "
            f"{v['new_blocks_per_step']:.2f} new blocks per decode step",
            f"    recompute: {v['recompute_flops'] / 1e12:.1f} TFLOP = "
            f"{v['recompute_s'] * 1e3:.0f} ms at peak",
            f"    swap: {v['swap_blocks']} blocks = {v['swap_bytes'] / 2**20:,.0f} MiB, "
            f"{v['swap_s_each_way'] * 1e3:.1f} ms each way",
        ]
        if v["regenerate_s"] is not None:
            lines.append(f"    generating it again: {v['regenerate_s']:.1f} s")
    lines += ["  assumptions:"] + [f"    {x}" for x in adv.assumptions]
    return "\n".join(lines)


def run_advise(ns: argparse.Namespace) -> int:
    gpu = lookup_gpu(ns.gpu) if ns.gpu and not ns.what_if else None
    try:
        extra = None
        if ns.what_if:
            obs, extra, gpu = _what_if(ns)
            items = [(obs.source, obs)]
        elif ns.run:
            from kvwatch.loadgen.rundir import observed_from_run

            items = [(str(ns.run), observed_from_run(ns.run))]
        elif ns.sidecar:
            import httpx

            url = ns.sidecar.rstrip("/") + "/api/state"
            try:
                doc = httpx.get(url, timeout=10).json()
            except (httpx.HTTPError, ValueError) as e:
                raise CliError(f"cannot read {url}: {e}", EXIT_UNREACHABLE) from None
            try:
                engines = engines_from_json(doc)
            except ValueError as e:
                raise CliError(f"{url}: {e}") from None
            items = observed_from_engines(engines, f"sidecar {ns.sidecar}")
        elif ns.prometheus:
            from kvwatch.sidecar.prom_source import observed_from_prometheus

            items = observed_from_prometheus(ns.prometheus, ns.window, ns.step)
        else:
            engines = asyncio.run(_watch_metrics(ns.metrics, ns.watch))
            items = observed_from_engines(engines, f"metrics {ns.metrics}")
        results = [(name, obs, advise(obs, ns.margin, gpu)) for name, obs in items]
    except SizingError as e:
        raise CliError(str(e)) from None
    if ns.json:
        print(
            json.dumps(
                [
                    {
                        "name": n,
                        "observed": o.__dict__,
                        "advice": a.to_dict(),
                        **({"what_if": extra} if extra else {}),
                    }
                    for n, o, a in results
                ],
                indent=2,
                default=str,
            )
        )
    else:
        print("\n\n".join(_render(n, o, a, extra) for n, o, a in results))
    return EXIT_FOUND if any(a.options for _, _, a in results) else 0
