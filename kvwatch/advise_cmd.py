"""`kvwatch advise`: sizing advice from a run directory, a live sidecar, a vLLM /metrics URL,
or figures alone (what-if). Exit 0 when the load fits, 1 when the cache is undersized."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from kvwatch.sidecar.advice import (
    Advice,
    Observed,
    advise,
    kv_bytes_per_token_from,
    several_groups_note,
)
from kvwatch.sidecar.command import EXIT_FOUND, EXIT_UNREACHABLE, CliError
from kvwatch.sidecar.kvmath import SizingError, lookup_gpu
from kvwatch.sidecar.levers import ServerInfo
from kvwatch.sidecar.views import EngineView, engines_from_json, servers_from_json

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
                    ssm_state_dtype=s.ssm_state_dtype,
                    source=source,
                    notes=several_groups_note(
                        s.capacity_blocks, s.block_size, s.capacity_tokens, None
                    ),
                    admission_rejections=s.admission_rejections_long,
                    offload_allocation_failures=s.offload_allocation_failures_long,
                    kv_offloading_gib=s.kv_offloading_gib,
                    prompt_cache_hit_share=s.prompt_cache_hit_share,
                ),
            )
        )
    if not out:
        raise SizingError(f"{source}: no vLLM engine seen")
    return out


async def _watch_metrics(
    url: str, seconds: float
) -> tuple[list[tuple[str, EngineView]], str | None]:
    import httpx

    from kvwatch.sidecar.scrape import fetch_version, metrics_url, scrape_once
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
                version = await fetch_version(client, url, 5.0)
                return [(t.target, e) for t in state.view().targets for e in t.engines], version
            await asyncio.sleep(1.0)


def _render(name: str, obs: Observed, adv: Advice) -> str:
    lines = [f"{name}: {adv.verdict}", f"  advised for {adv.advised_for}"]
    if obs.preemptions:
        lines.append(f"  preemptions observed: {obs.preemptions:,.0f}")
    lines += ["  arithmetic:"] + [f"    {x}" for x in adv.arithmetic]
    if adv.recommended:
        lines.append(f"  recommended: {adv.recommended}")
    if adv.options:
        lines += ["  change one of:"] + [f"    {x}" for x in adv.options]
    lines += ["  assumptions:"] + [f"    {x}" for x in adv.assumptions]
    return "\n".join(lines)


def _run_what_if(ns: argparse.Namespace) -> int:
    from kvwatch.whatif import render_what_if, what_if

    a = what_if(ns)
    server = ServerInfo(version=ns.vllm_version)
    adv = None if a.observed is None else advise(a.observed, ns.margin, a.gpu, server)
    if ns.json:
        item: dict[str, Any] = {"name": a.name, "what_if": a.to_dict()}
        if a.observed is not None and adv is not None:
            item |= {"observed": _observed_dict(a.observed), "advice": adv.to_dict()}
        print(json.dumps([item], indent=2, default=str))
    else:
        lines = [f"{a.name}:", *render_what_if(a)]
        if a.observed is not None and adv is not None:
            lines += [
                "",
                _render(f"{a.name}, {a.observed.peak_demand:g} requests", a.observed, adv),
            ]
        print("\n".join(lines))
    return EXIT_FOUND if adv is not None and adv.options else 0


def _with_model(obs: Observed, model: str) -> Observed:
    """The engine's KV groups from its model, checked against the server's own figures."""
    from dataclasses import replace

    from kvwatch.sidecar.kvmath import resolve_model
    from kvwatch.sidecar.kvplan import layout_for_engine

    arch = resolve_model(model)
    layout = layout_for_engine(
        arch,
        obs.block_size,
        obs.kv_dtype,
        obs.capacity_blocks,
        obs.kv_cache_memory_bytes,
        ssm_state_dtype=obs.ssm_state_dtype,
    )
    return replace(obs, layout=layout, source=f"{obs.source} (model {arch.name})")


def _observed_dict(o: Observed) -> dict[str, Any]:
    d = {k: v for k, v in o.__dict__.items() if k != "layout"}
    d["layout"] = None if o.layout is None else [g.kind for g in o.layout.groups]
    return d


def run_advise(ns: argparse.Namespace) -> int:
    try:
        if ns.what_if:
            return _run_what_if(ns)
        gpu = lookup_gpu(ns.gpu) if ns.gpu else None
        server = ServerInfo()  # one server's version, where the source tells it
        if ns.run:
            from kvwatch.loadgen.rundir import observed_from_run, server_from_run

            items = [(str(ns.run), observed_from_run(ns.run))]
            server = server_from_run(ns.run)
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
            servers = servers_from_json(doc)
            if len(servers) == 1:
                server = next(iter(servers.values()))
        elif ns.prometheus:
            from kvwatch.sidecar.prom_source import observed_from_prometheus

            items = observed_from_prometheus(ns.prometheus, ns.window, ns.step)
        else:
            engines, version = asyncio.run(_watch_metrics(ns.metrics, ns.watch))
            items = observed_from_engines(engines, f"metrics {ns.metrics}")
            server = ServerInfo(version=version)
        if ns.model:
            items = [(name, _with_model(obs, ns.model)) for name, obs in items]
        results = [(name, obs, advise(obs, ns.margin, gpu, server)) for name, obs in items]
    except SizingError as e:
        raise CliError(str(e)) from None
    if ns.json:
        print(
            json.dumps(
                [
                    {"name": n, "observed": _observed_dict(o), "advice": a.to_dict()}
                    for n, o, a in results
                ],
                indent=2,
                default=str,
            )
        )
    else:
        print("\n\n".join(_render(n, o, a) for n, o, a in results))
    return EXIT_FOUND if any(a.options for _, _, a in results) else 0
