"""The server's own view, read from its /metrics: a snapshot before and after a run, and a
timeline sampled during it.

Stored in the run directory so advice and reports can use the server's view (preemptions,
per-request preemption counts, KV usage over time, the cache's size) next to the client's
records. With a sidecar, the timeline also carries the sidecar's judgement (ok ... thrashing).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any

import httpx

from kvwatch.sidecar.exposition import parse_exposition
from kvwatch.sidecar.observe import EngineKey, EngineObservation, observe

__all__ = ["server_snapshot", "summarize_engines", "TimelineRecorder", "PLAIN_TEXT"]

# vLLM's prometheus-client writes `vllm_` names when asked for OpenMetrics; ask for text.
PLAIN_TEXT = {"Accept": "text/plain; version=0.0.4"}
_COUNTERS = (
    "preemptions_total",
    "finished_requests_total",
    "repeat_preempted_total",
    "generation_tokens_total",
    "prompt_tokens_total",
)


def _sum(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def summarize_engines(engines: dict[EngineKey, EngineObservation]) -> dict[str, Any]:
    """One server-wide row: counters and queues summed over engines, KV usage the highest."""
    obs = list(engines.values())
    out: dict[str, Any] = {"engines": len(obs)}
    for name in _COUNTERS:
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


async def server_snapshot(client: httpx.AsyncClient, base_url: str) -> dict[str, Any] | None:
    """None when the server has no readable vLLM /metrics."""
    try:
        r = await client.get(base_url.rstrip("/") + "/metrics", headers=PLAIN_TEXT)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    engines = observe(parse_exposition(r.text))
    return summarize_engines(engines) if engines else None


class TimelineRecorder:
    """Samples the server's /metrics (and a sidecar's state) once a period in its own thread,
    so the event loop that sends requests never waits on it. Rows carry unix time `t`."""

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

    def sample(self, client: httpx.Client) -> dict[str, Any] | None:
        row: dict[str, Any] = {"t": time.time()}
        try:
            r = client.get(self.base_url + "/metrics", headers={**self.headers, **PLAIN_TEXT})
            engines = observe(parse_exposition(r.text)) if r.status_code == 200 else {}
        except httpx.HTTPError:
            engines = {}
        if not engines:
            self.errors += 1
            return None
        s = summarize_engines(engines)
        row.update({k: s[k] for k in ("kv_usage", "running", "waiting", *_COUNTERS)})
        if self.sidecar_url:
            row["state"] = _sidecar_state(client, self.sidecar_url)
        return row

    def _run(self) -> None:
        with httpx.Client(timeout=max(1.0, self.period_s)) as client:
            while True:
                row = self.sample(client)
                if row is not None:
                    self.rows.append(row)
                if self._stop.wait(self.period_s):
                    return

    def __enter__(self) -> TimelineRecorder:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()


def _sidecar_state(client: httpx.Client, sidecar_url: str) -> str | None:
    """The worst state the sidecar gives any engine of this server."""
    order = ("ok", "pressure", "saturated", "thrashing")
    try:
        snap = client.get(sidecar_url + "/api/state").json()
    except (httpx.HTTPError, ValueError):
        return None
    states = [
        e["state"]
        for t in snap.get("targets", [])
        for e in t.get("engines", [])
        if e.get("present") and e.get("state") in order
    ]
    return max(states, key=order.index) if states else None
