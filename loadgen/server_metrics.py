"""A snapshot of the server's own counters and KV configuration, taken before and after a run.

Stored in the run directory so advice and reports can use the server's view (preemptions,
per-request preemption counts, the cache's size) next to the client's records.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import httpx

from sidecar.exposition import parse_exposition
from sidecar.observe import observe

__all__ = ["server_snapshot"]


async def server_snapshot(client: httpx.AsyncClient, base_url: str) -> dict[str, Any] | None:
    """Summed over engines; None when the server has no readable vLLM /metrics."""
    try:
        r = await client.get(
            base_url.rstrip("/") + "/metrics", headers={"Accept": "text/plain; version=0.0.4"}
        )
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    engines = observe(parse_exposition(r.text))
    if not engines:
        return None
    out: dict[str, Any] = {"engines": len(engines)}
    for name in (
        "preemptions_total",
        "finished_requests_total",
        "repeat_preempted_total",
        "generation_tokens_total",
        "prompt_tokens_total",
    ):
        vals = [getattr(o, name) for o in engines.values() if getattr(o, name) is not None]
        out[name] = sum(vals) if vals else None
    caches = [o.cache for o in engines.values() if o.cache is not None]
    out["cache"] = asdict(caches[0]) if caches else None
    return out
