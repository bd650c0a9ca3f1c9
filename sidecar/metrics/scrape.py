"""Scrape one vLLM `/metrics` endpoint with httpx, turning every failure into a counted reason.

The one way kvwatch fetches `/metrics`: the sidecar's loops, `kvwatch advise --metrics`, and the
load generator's snapshots and timeline all call `scrape_once`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from kvwatch.sidecar.contract.twin_metrics import TWIN_METRICS
from kvwatch.sidecar.metrics.exposition import Exposition, parse_exposition
from kvwatch.sidecar.metrics.observe import OBSERVED
from kvwatch.sidecar.metrics.twin import read_time_scale
from kvwatch.sizing.levers import valid_version

__all__ = [
    "health_url",
    "check_health",
    "metrics_url",
    "version_url",
    "scrape_once",
    "fetch_version",
    "ScrapeOutcome",
    "MAX_BODY_BYTES",
    "ACCEPT",
]

MAX_BODY_BYTES = 32 * 1024 * 1024
# Ask for the classic text format: with OpenMetrics, prometheus-client 0.23-0.26 writes `vllm_`
# sample names (client_python #1177). We read both spellings anyway.
ACCEPT = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class ScrapeOutcome:
    """One scrape: an exposition, or why it failed (timeout, connect, http_5xx...)."""

    duration_s: float
    exposition: Exposition | None = None
    error_reason: str | None = None
    error: str | None = None
    # a kvwatch twin's declared time scale (metrics/twin.py); None: a real server
    time_scale: float | None = None


def metrics_url(target: str) -> str:
    """A base URL gets `/metrics`; a URL that already names a path is used as given."""
    url = httpx.URL(target)
    if url.path in ("", "/"):
        return str(url.copy_with(path="/metrics"))
    return target


def version_url(target: str) -> str:
    """vLLM's `GET /version` beside the target's metrics path."""
    return str(httpx.URL(metrics_url(target)).copy_with(path="/version", query=None))


def health_url(target: str) -> str:
    """vLLM's `GET /health` beside the target's metrics path."""
    return str(httpx.URL(metrics_url(target)).copy_with(path="/health", query=None))


@functools.lru_cache(maxsize=256)
def _health(target: str) -> httpx.URL:
    """health_url, parsed once a target: it is asked every scrape (0.2 ms a time here)."""
    return httpx.URL(health_url(target))


async def check_health(
    client: httpx.AsyncClient, target: str, timeout_s: float
) -> tuple[bool, str]:
    """(ok, why not): vLLM's `/health` answers 200 while its engine works and 503 once the
    engine is dead; a timeout or a refused connection is not ok either. Never raises."""
    try:
        async with asyncio.timeout(timeout_s):
            r = await client.get(_health(target), timeout=timeout_s)
    except TimeoutError:
        return False, "timeout"
    except httpx.HTTPError as e:
        return False, type(e).__name__
    # a 4xx says nothing of the engine (a bare exporter without /health, a proxy that wants
    # credentials for it): only a server error is a failing engine
    return r.status_code < 500, f"HTTP {r.status_code}"


async def fetch_version(client: httpx.AsyncClient, target: str, timeout_s: float) -> str | None:
    """The server's vLLM version from `GET /version` (`{"version": "0.32.0"}`), or None when it
    does not say (an older server, a proxy, a body that is not that): never raises."""
    try:
        async with asyncio.timeout(timeout_s):
            r = await client.get(version_url(target), timeout=timeout_s)
        if r.status_code != 200 or len(r.content) > 4096:
            return None
        doc = r.json()
    except (TimeoutError, httpx.HTTPError, ValueError):
        return None
    v = doc.get("version") if isinstance(doc, dict) else None
    return valid_version(v)


async def scrape_once(
    client: httpx.AsyncClient,
    url: str | httpx.URL,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> ScrapeOutcome:
    """`headers` add to the request's (an Authorization header, say)."""
    t0 = time.monotonic()

    def fail(reason: str, msg: str) -> ScrapeOutcome:
        return ScrapeOutcome(time.monotonic() - t0, error_reason=reason, error=msg)

    sent = {**(headers or {}), "Accept": ACCEPT}
    try:
        # one deadline for the whole scrape (connect, headers, body): httpx's timeout bounds
        # each read, so a target trickling its body a byte a second would never time out
        async with (
            asyncio.timeout(timeout_s),
            client.stream("GET", url, headers=sent, timeout=timeout_s) as r,
        ):
            if r.status_code != 200:
                return fail(f"http_{r.status_code // 100}xx", f"{url}: HTTP {r.status_code}")
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return fail("too_large", f"{url}: body over {MAX_BODY_BYTES} bytes")
    except TimeoutError:
        return fail("timeout", f"{url}: no whole answer within {timeout_s:g} s")
    except httpx.TimeoutException as e:
        return fail("timeout", f"{url}: timed out after {timeout_s:g} s ({type(e).__name__})")
    except httpx.ConnectError as e:
        return fail("connect", f"{url}: cannot connect ({e})")
    except httpx.HTTPError as e:
        return fail("transport", f"{url}: {type(e).__name__}: {e}")
    text = body.decode("utf-8", "replace")
    exp = parse_exposition(text, OBSERVED)  # only what observe() reads
    scale = read_time_scale(text) if TWIN_METRICS.time_scale in text else None
    return ScrapeOutcome(time.monotonic() - t0, exposition=exp, time_scale=scale)
