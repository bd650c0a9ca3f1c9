"""One GET of a JSON answer under one deadline for the whole of it (connect, headers, body):
httpx's timeout bounds each read, so a server that sends a byte a second would never time out.
For the commands that read a server once (advise from Prometheus or a sidecar); the sidecar's
scrape loop has its own (kvwatch.sidecar.metrics.scrape)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["Answer", "ReadError", "get_json"]

MAX_BYTES = 64 * 1024 * 1024  # a Prometheus answer for thousands of series is a few MB


class ReadError(Exception):
    """The server could not be read: unreachable, too slow, or too much (exit 3 where a
    command says so); the message is one line, and the caller names the URL."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON
    text: str  # the first 200 characters, for a message


def get_json(
    client: httpx.Client,
    url: str,
    *,
    params: dict[str, Any] | None = None,
    deadline_s: float = 30.0,
    max_bytes: int = MAX_BYTES,
) -> Answer:
    """The answer's status and JSON; ReadError when it is not all here within `deadline_s`,
    is over `max_bytes`, or the server cannot be reached; ValueError when it is not JSON."""
    start = time.monotonic()
    body = bytearray()
    try:
        with client.stream("GET", url, params=params, timeout=deadline_s) as r:
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ReadError(f"an answer over {max_bytes:,} bytes")
                if time.monotonic() - start > deadline_s:
                    raise ReadError(f"no whole answer within {deadline_s:g} s")
            status = r.status_code
    except httpx.TimeoutException:
        raise ReadError(f"no answer within {deadline_s:g} s") from None
    except httpx.HTTPError as e:
        raise ReadError(str(e) or type(e).__name__) from None
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"{url} answered HTTP {status}, not JSON") from None
    return Answer(status, doc, text[:200])
