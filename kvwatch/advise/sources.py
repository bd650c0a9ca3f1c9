"""Where `kvwatch advise` reads what a server saw: a run directory, a live sidecar's
`/api/state`, a vLLM `/metrics` URL watched for a while (judged by the sidecar's own state), or
Prometheus history (advise/prometheus.py). Each gives one `Observed` per engine and, where the
source tells it, the server's vLLM release (which flags the advice may name)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError
from kvwatch.sidecar.state.views import (
    EngineView,
    engines_from_json,
    fleet_prefix_from_json,
    prefix_curves_from_json,
    servers_from_json,
)
from kvwatch.sizing.advice import (
    FleetPrefixSeen,
    Observed,
    PrefixCurveSeen,
    kv_bytes_per_token_from,
    several_groups_note,
)
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import LayerSource
from kvwatch.sizing.levers import ServerInfo

if TYPE_CHECKING:
    from kvwatch.loadgen.results.run_files import RunFiles

SIDECAR_DEADLINE_S = 10.0  # for the whole of /api/state, not each read of it

__all__ = ["observed_from_source", "observed_from_engines"]


def observed_from_source(
    ns: argparse.Namespace, run: RunFiles | None = None
) -> tuple[list[tuple[str, Observed]], ServerInfo]:
    """What the source `ns` names saw, per engine, and the server's release where it is one
    server (`--model` re-plans each engine's KV groups from the model). `run`: `--run`'s
    directory, read by the caller (which reads it once for all of the advice)."""
    server = ServerInfo()  # one server's version, where the source tells it
    if run is not None:
        from kvwatch.loadgen.results.run_observed import observed_from_run

        observed, server = observed_from_run(run)
        items = [(str(run.directory), observed)]
    elif ns.sidecar:
        import httpx

        from kvwatch.common.http_read import ReadError, get_json

        url = ns.sidecar.rstrip("/") + "/api/state"
        try:
            with httpx.Client() as client:
                doc = get_json(client, url, deadline_s=SIDECAR_DEADLINE_S).body
        except (ReadError, ValueError) as e:
            raise CliError(f"cannot read {url}: {e}", EXIT_UNREACHABLE) from None
        try:
            engines = engines_from_json(doc)
        except ValueError as e:
            raise CliError(f"{url}: {e}") from None
        try:
            curves = prefix_curves_from_json(doc)
            fleet = fleet_prefix_from_json(doc)
        except ValueError as e:
            raise CliError(f"{url}: {e}") from None
        items = observed_from_engines(engines, f"sidecar {ns.sidecar}", curves, fleet)
        servers = servers_from_json(doc)
        if len(servers) == 1:
            server = next(iter(servers.values()))
    elif ns.prometheus:
        from kvwatch.advise.prometheus import observed_from_prometheus

        items = observed_from_prometheus(ns.prometheus, ns.window, ns.step)
    else:
        engines, version = asyncio.run(_watch_metrics(ns.metrics, ns.watch))
        items = observed_from_engines(engines, f"metrics {ns.metrics}")
        server = ServerInfo(version=version)
    if ns.model:
        items = [(name, _with_model(obs, ns.model, ns.layers)) for name, obs in items]
    return items, server


def observed_from_engines(
    engines: Sequence[tuple[str, EngineView]],
    source: str,
    curves: Mapping[str, PrefixCurveSeen] | None = None,
    fleet: FleetPrefixSeen | None = None,
) -> list[tuple[str, Observed]]:
    """One Observed per engine a sidecar sees (its own state, or another's /api/state), with
    its target's prefix-cache curve where the sidecar follows its KV events."""
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
                    prompt_cache_hit_share_long=s.prompt_cache_hit_share_long,
                    prompt_cache_hit_reference=s.prompt_cache_hit_reference,
                    prompt_tokens_per_s_long=s.prompt_tokens_per_s_long,
                    prefix_cache_thrashing=e.prefix_cache_thrashing_since_unix is not None,
                    prefix_curve=(curves or {}).get(target),
                    fleet_prefix=fleet if fleet and target in fleet.targets else None,
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

    from kvwatch.sidecar.contract.thresholds import Thresholds
    from kvwatch.sidecar.metrics.scrape import fetch_version, metrics_url, scrape_once
    from kvwatch.sidecar.state.sidecar_state import SidecarState

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


def _with_model(obs: Observed, model: str, layers: LayerSource) -> Observed:
    """The engine's KV groups from its model, checked against the server's own figures."""
    from dataclasses import replace

    from kvwatch.sizing.kvmath import resolve_model
    from kvwatch.sizing.kvplan import layout_for_engine

    arch = resolve_model(model, layers)
    layout = layout_for_engine(
        arch,
        obs.block_size,
        obs.kv_dtype,
        obs.capacity_blocks,
        obs.kv_cache_memory_bytes,
        ssm_state_dtype=obs.ssm_state_dtype,
    )
    return replace(obs, layout=layout, source=f"{obs.source} (model {arch.name})")
