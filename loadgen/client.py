"""Stream one OpenAI-compatible completion and record its timing, never raising for server faults.

Errors (refused connections, HTTP errors, a stream cut mid-way, malformed SSE) become fields of
the record, so a run with failures still yields a full set of records.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from loadgen.records import RequestRecord

__all__ = ["stream_completion", "served_model"]

_DATA = "data:"


async def served_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model id that `/v1/models` lists."""
    r = await client.get(base_url.rstrip("/") + "/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no model")
    return str(data[0]["id"])


async def stream_completion(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    record: RequestRecord,
    endpoint: str = "/v1/completions",
) -> RequestRecord:
    """POST `body` with streaming and usage on; fill `record` as chunks arrive."""
    payload = dict(body, stream=True, stream_options={"include_usage": True})
    url = base_url.rstrip("/") + endpoint
    record.sent_at = time.perf_counter()
    done = False
    try:
        async with client.stream("POST", url, json=payload) as resp:
            record.status = resp.status_code
            if resp.status_code >= 400:
                text = (await resp.aread())[:300].decode("utf-8", "replace")
                record.error = f"HTTP {resp.status_code}: {text}"
                return record
            async for line in resp.aiter_lines():
                now = time.perf_counter()
                if not line.startswith(_DATA):
                    continue
                data = line[len(_DATA) :].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    record.error = f"malformed SSE data: {data[:120]!r}"
                    return record
                _take_chunk(chunk, record, now)
    except httpx.HTTPError as e:
        record.error = f"{type(e).__name__}: {e}"
        return record
    finally:
        record.finished_at = time.perf_counter()
    if not done:
        record.error = "stream ended without [DONE]"
    return record


def _take_chunk(chunk: dict[str, Any], record: RequestRecord, now: float) -> None:
    if "error" in chunk:
        record.error = f"server error in stream: {str(chunk['error'])[:200]}"
        return
    for choice in chunk.get("choices") or []:
        if _carries_output(choice):
            if record.first_token_at is None:
                record.first_token_at = now
            record.token_times.append(now)
            break
    usage = chunk.get("usage")
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = usage.get("completion_tokens")


def _carries_output(choice: dict[str, Any]) -> bool:
    """A chunk for generated output, even with empty text: a token that ends mid-way through a
    UTF-8 character streams as "". Chat's first delta only announces the role and is no token."""
    if "text" in choice:
        return choice["text"] is not None
    delta = choice.get("delta") or {}
    return delta.get("content") is not None and "role" not in delta
