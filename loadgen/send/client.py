"""Stream one OpenAI-compatible completion and record its timing, never raising for server faults.

Errors (refused connections, HTTP errors, a stream cut mid-way, malformed SSE) become fields of
the record, so a run with failures still yields a full set of records. Requests go through the
lean HTTP/1.1 pool (`send/http1.py`); the one-off `/v1/models` lookup uses httpx.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from kvwatch.common.cli_kit import one_line
from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.send.http1 import Http1Pool

__all__ = [
    "completion_request", "start_completion", "stream_completion", "served_model", "max_model_len",
    "server_id_for",
]  # fmt: skip

_DATA = b"data:"
_ERROR_BODY = 300  # bytes of an error response kept in the record
_MAX_MODEL_NAME = 1024
_MAX_COUNT = 2**53  # a token count or id at or past this is no server's


async def served_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model id that `/v1/models` lists; ValueError (one line) where it lists none
    (an answer not of that shape included: it is where the load would go)."""
    r = await client.get(base_url.rstrip("/") + "/v1/models")
    if r.status_code != 200:  # httpx's own message runs to a second line
        raise ValueError(f"{base_url}/v1/models answered HTTP {r.status_code}")
    doc = r.json()
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    name = first.get("id") if isinstance(first, dict) else None
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_MODEL_NAME:
        raise ValueError(f"{base_url}/v1/models lists no model (give one with --model)")
    return one_line(name)


async def max_model_len(client: httpx.AsyncClient, base_url: str, model: str) -> int | None:
    """The context length vLLM's `/v1/models` says `model` has (None: not said)."""
    try:
        r = await client.get(base_url.rstrip("/") + "/v1/models")
        if r.status_code != 200:
            return None
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == model:
            n = entry.get("max_model_len")
            ok = isinstance(n, int) and not isinstance(n, bool) and 0 < n < _MAX_COUNT
            return n if ok else None
    return None


def completion_request(
    pool: Http1Pool, body: dict[str, Any], endpoint: str, server_id: str | None = None
) -> bytes:
    """The bytes of a streaming request with usage reporting on, built ahead of its due time.
    `server_id` (from `server_id_for`) goes as `X-Request-Id`, which vLLM takes into its own
    id (`cmpl-{id}-...`): its logs and the twin's step trace then name the run's requests."""
    payload = dict(body, stream=True, stream_options={"include_usage": True})
    extra = {"X-Request-Id": server_id} if server_id else None
    return pool.encode_post(endpoint, json.dumps(payload).encode(), extra)


_RUN_TAG = f"kvw{secrets.token_hex(4)}"  # one per process: two runs on one server never clash


def server_id_for(request_id: str) -> str:
    """The id the server is given for a run's request: unique to this process's run (vLLM
    releases before the random suffix refused a duplicate id in flight), percent-encoded past
    a safe set (a stage is named by the user: a CR or LF in it would end the header)."""
    return f"{_RUN_TAG}-{quote(request_id, safe='/:._-')}"


def start_completion(
    pool: Http1Pool, request: bytes, record: RequestRecord
) -> asyncio.Future[None]:
    """Send now (on a warm connection); the future is done when `record` is complete."""

    def sent(t: float) -> None:
        record.sent_at = t

    return pool.post(request, _StreamRecorder(record), sent)


async def stream_completion(
    pool: Http1Pool,
    body: dict[str, Any],
    record: RequestRecord,
    endpoint: str = "/v1/completions",
) -> RequestRecord:
    """POST `body` with streaming and usage on; fill `record` as chunks arrive."""
    await start_completion(pool, completion_request(pool, body, endpoint), record)
    return record


class _StreamRecorder:
    """Fills a record from an SSE stream as its bytes arrive (an `http1.ResponseSink`)."""

    __slots__ = ("record", "pending", "done", "failed", "error_body")

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.pending = b""  # an SSE line not yet ended
        self.done = False  # [DONE] seen
        self.failed = False
        self.error_body = b""

    def status(self, code: int) -> None:
        self.record.status = code
        self.failed = code >= 400

    def data(self, chunk: bytes, now: float) -> None:
        if self.failed:
            if len(self.error_body) < _ERROR_BODY:
                self.error_body += chunk[: _ERROR_BODY - len(self.error_body)]
            return
        if self.done or self.record.error is not None:
            return
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if not line.startswith(_DATA):
                continue
            data = line[len(_DATA) :].strip()
            if data == b"[DONE]":
                self.done = True
                return
            try:
                parsed = _CHUNK.decode(data)
            except msgspec.ValidationError:  # valid JSON, not a completion chunk
                self.record.error = f"SSE data is not a completion chunk: {data[:120]!r}"
                return
            except msgspec.DecodeError:
                self.record.error = f"malformed SSE data: {data[:120]!r}"
                return
            _take_chunk(parsed, self.record, now)

    def end(self, error: str | None) -> None:
        rec = self.record
        rec.finished_at = time.perf_counter()
        if rec.error is not None:
            return
        if error is not None:
            rec.error = one_line(error)
        elif self.failed:
            text = self.error_body.decode("utf-8", "replace")
            rec.error = one_line(f"HTTP {rec.status}: {text}")  # a record's error is one line
        elif not self.done:
            rec.error = "stream ended without [DONE]"


class _Delta(msgspec.Struct):
    content: str | None | msgspec.UnsetType = msgspec.UNSET
    role: str | None | msgspec.UnsetType = msgspec.UNSET


class _Choice(msgspec.Struct):
    text: str | None | msgspec.UnsetType = msgspec.UNSET  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions
    token_ids: list[int] | None = None  # vLLM's, with `return_token_ids`


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _ServerTimings(msgspec.Struct):
    """vLLM's per-request timings (`--enable-per-request-metrics`), on the last usage chunk."""

    queue_time_ms: float | None = None
    time_to_first_token_ms: float | None = None


class _Chunk(msgspec.Struct):
    """The fields of a streamed chunk the record needs; the rest is skipped unread. The decoder
    checks the whole chunk is JSON and these fields have their types (a string for a number is
    refused), at about a fifth of `json.loads`'s cost: it runs once per token."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    # read apart: a server's odd timings must not cost the request its record
    metrics: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_CHUNK = msgspec.json.Decoder(_Chunk)
_TIMINGS = msgspec.json.Decoder(_ServerTimings)


def _take_chunk(chunk: _Chunk, record: RequestRecord, now: float) -> None:
    if chunk.error is not msgspec.UNSET:
        what = bytes(chunk.error)[:200].decode("utf-8", "replace")
        record.error = one_line(f"server error in stream: {what}")
        return
    for choice in chunk.choices or ():
        if record.output_token_ids is not None and choice.token_ids:
            if not all(0 <= t < _MAX_COUNT for t in choice.token_ids):
                record.error = "the server's token_ids are not token ids (negative or huge)"
                return
            record.output_token_ids.extend(choice.token_ids)
        if _carries_output(choice):
            if record.first_token_at is None:
                record.first_token_at = now
            record.token_times.append(now)
            break
    usage = chunk.usage
    if usage is not None:  # a count no request has is not the server's word on it
        record.prompt_tokens = _count(usage.prompt_tokens)
        record.output_tokens = _count(usage.completion_tokens)
    if chunk.metrics is not msgspec.UNSET:
        _take_timings(bytes(chunk.metrics), record)


def _count(n: int | None) -> int | None:
    return n if n is not None and 0 <= n < _MAX_COUNT else None


def _take_timings(raw: bytes, record: RequestRecord) -> None:
    """The server's own queue time and TTFT, in seconds; a value that is not a finite
    non-negative number is left out (the client's timings stand alone)."""
    try:
        t = _TIMINGS.decode(raw)
    except msgspec.MsgspecError:
        return
    record.server_queue_time = _seconds(t.queue_time_ms)
    record.server_ttft = _seconds(t.time_to_first_token_ms)


def _seconds(ms: float | None) -> float | None:
    if ms is None or not (0 <= ms < float("inf")):
        return None
    return ms / 1000.0


def _carries_output(choice: _Choice) -> bool:
    """A chunk for generated output, even with empty text: a token that ends mid-way through a
    UTF-8 character streams as "". Chat's first delta only announces the role and is no token."""
    if choice.text is not msgspec.UNSET:
        return choice.text is not None
    delta = choice.delta
    if delta is None:
        return False
    return (
        delta.content is not msgspec.UNSET
        and delta.content is not None
        and (delta.role is msgspec.UNSET)
    )
