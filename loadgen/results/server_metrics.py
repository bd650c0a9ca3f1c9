"""The server's own view, read from its /metrics: a snapshot before and after a run, and a
timeline sampled during it.

Stored in the run directory so advice and reports can use the server's view (preemptions,
per-request preemption counts, KV usage over time, the cache's size) next to the client's
records. With a sidecar, the timeline also carries the sidecar's judgement (ok ... thrashing).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import httpx

from kvwatch.sidecar.judge.timeline import COUNTERS
from kvwatch.sidecar.metrics.observe import EngineKey, EngineObservation, observe
from kvwatch.sidecar.metrics.scrape import fetch_version, scrape_once
from kvwatch.sidecar.state.views import engines_from_json

__all__ = [
    "server_snapshot", "summarize_engines", "TimelineRecorder", "sidecar_incidents",
    "sidecar_preemptions",
]  # fmt: skip

_TIMEOUT_S = 10.0


def _sum(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def summarize_engines(engines: dict[EngineKey, EngineObservation]) -> dict[str, Any]:
    """One server-wide row: counters and queues summed over engines, KV usage the highest."""
    obs = list(engines.values())
    out: dict[str, Any] = {"engines": len(obs)}
    for name in COUNTERS:
        out[name] = _sum([getattr(o, name) for o in obs])
    out["running"] = _sum([o.running for o in obs])
    out["waiting"] = _sum([o.waiting for o in obs])
    usage = [o.kv_usage for o in obs if o.kv_usage is not None]
    out["kv_usage"] = max(usage) if usage else None
    buckets: dict[float, float] = {}
    for o in obs:
        for le, n in o.preemption_buckets:
            buckets[le] = buckets.get(le, 0.0) + n
    out["preemption_buckets"] = sorted(buckets.items())
    caches = [o.cache for o in obs if o.cache is not None]
    out["cache"] = asdict(caches[0]) if caches else None
    return out


async def server_snapshot(
    client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """None when the server has no readable vLLM /metrics. Carries the server's version
    (`GET /version`) where it answers, so advice can name the flags that version has."""
    engines = await _engines(client, base_url, headers)
    if not engines:
        return None
    return {**summarize_engines(engines), "version": await fetch_version(client, base_url, 5.0)}


async def _engines(
    client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str] | None
) -> dict[EngineKey, EngineObservation]:
    out = await scrape_once(client, base_url.rstrip("/") + "/metrics", _TIMEOUT_S, headers)
    return {} if out.exposition is None else observe(out.exposition)


_SWITCH_S = 0.0005  # the GIL switch interval while the sampler thread runs


class TimelineRecorder:
    """Samples the server's /metrics (and a sidecar's state) once a period in its own thread
    with its own event loop, so the loop that sends requests never waits on it. Rows carry
    unix time `t`."""

    def __init__(
        self,
        base_url: str,
        sidecar_url: str | None = None,
        headers: dict[str, str] | None = None,
        period_s: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.sidecar_url = sidecar_url.rstrip("/") if sidecar_url else None
        self.headers = headers or {}
        self.period_s = period_s
        self.rows: list[dict[str, Any]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, name="kvwatch-timeline", daemon=True)

    async def sample(self, client: httpx.AsyncClient) -> dict[str, Any] | None:
        row: dict[str, Any] = {"t": time.time()}
        engines = await _engines(client, self.base_url, self.headers)
        if not engines:
            self.errors += 1
            return None
        s = summarize_engines(engines)
        row.update({k: s[k] for k in ("kv_usage", "running", "waiting", *COUNTERS)})
        if self.sidecar_url:
            row["state"] = await _sidecar_state(client, self.sidecar_url)
        return row

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=max(1.0, self.period_s)) as client:
            while True:
                row = await self.sample(client)
                if row is not None:
                    self.rows.append(row)
                if await asyncio.to_thread(self._stop.wait, self.period_s):
                    return

    def __enter__(self) -> TimelineRecorder:
        # While this thread parses a /metrics body (a twin's or a big server's: hundreds of
        # KB), the sending thread waits for the GIL up to the interpreter's switch interval
        # (5 ms): the ten requests at the head of Mooncake's trace, sent as the first sample
        # was parsed, left 1.6-3.6 ms late. At 0.5 ms they do not (docs/loadgen.md).
        self._switch_s = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_S)
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()
        sys.setswitchinterval(self._switch_s)


async def _sidecar_state(client: httpx.AsyncClient, sidecar_url: str) -> str | None:
    """The worst state the sidecar gives any engine of this server."""
    try:
        r = await client.get(sidecar_url + "/api/state")
        engines = engines_from_json(r.json())
    except (httpx.HTTPError, ValueError):
        return None
    levels = [e.level for _, e in engines if e.present]
    return max(levels).label if levels else None


async def sidecar_preemptions(
    client: httpx.AsyncClient, sidecar_url: str, target: str
) -> float | None:
    """The preemptions a sidecar has seen on this server's engines so far (its counter, kept
    across vLLM restarts); None when it does not watch that server or cannot be read."""
    try:
        r = await client.get(sidecar_url.rstrip("/") + "/api/state")
        engines = engines_from_json(r.json())
    except (httpx.HTTPError, ValueError):
        return None
    seen = [
        e.signals.preemptions_observed for t, e in engines if t.rstrip("/") == target.rstrip("/")
    ]
    return sum(seen) if seen else None


_INCIDENT_KEYS = ("what", "at", "until", "detail", "cause", "lines")


async def sidecar_incidents(client: httpx.AsyncClient, sidecar_url: str) -> dict[str, Any]:
    """What the sidecar knows of each target's engine at the end of a run: its status (alive,
    dead, stuck) and the incidents its followed log told of. Input from outside: only the
    known keys, as strings and numbers, are kept."""
    try:
        doc = (await client.get(sidecar_url + "/api/state")).json()
        targets = doc["targets"]
        if not isinstance(targets, list):
            raise ValueError
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return {}
    out: dict[str, Any] = {"engines": {}, "incidents": []}
    for t in targets:
        if not isinstance(t, dict):
            continue
        name = str(t.get("target", ""))[:300]
        status = t.get("engine_status")
        if isinstance(status, str):
            reason = t.get("engine_status_reason")
            out["engines"][name] = {
                "status": status[:20],
                "reason": reason[:1000] if isinstance(reason, str) else "",
            }
        log = t.get("log")
        for i in (log.get("incidents") if isinstance(log, dict) else None) or []:
            if isinstance(i, dict) and isinstance(i.get("what"), str):
                kept = {k: i.get(k) for k in _INCIDENT_KEYS}
                out["incidents"].append(
                    {k: v[:1000] if isinstance(v, str) else v for k, v in kept.items()}
                )
    return out
