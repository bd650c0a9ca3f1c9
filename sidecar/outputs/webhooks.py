"""Webhook receivers: payload formats, HMAC signatures, and the delivery loop over the outbox.

Formats: `json` (kvwatch's own: one alert per message), `alertmanager` (the Alertmanager webhook
payload, version 4, so existing receivers work unchanged), `slack` (an incoming-webhook message).
A receiver may sign bodies with HMAC-SHA256 using a secret read from an environment variable
(`secret_env`); the secret is never logged or echoed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kvwatch.common.backoff import backoff_s
from kvwatch.sidecar.outputs.alerting import Notification
from kvwatch.sidecar.store.outbox import Outbox

__all__ = [
    "Receiver",
    "load_receivers",
    "render",
    "sign",
    "enqueue",
    "deliver_forever",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "redact_url",
    "FIELDS",
    "receivers_from",
]

log = logging.getLogger("kvwatch.webhooks")
SIGNATURE_HEADER = "X-Kvwatch-Signature"
TIMESTAMP_HEADER = "X-Kvwatch-Timestamp"
DELIVERY_HEADER = "X-Kvwatch-Delivery"
FORMATS = ("json", "alertmanager", "slack")
_MAX_TIMEOUT_S = 300.0
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SLACK_MAX = 2900
FIELDS = frozenset({"url", "format", "name", "secret_env", "timeout_s", "headers"})


@dataclass(frozen=True)
class Receiver:
    url: str
    format: str = "json"
    name: str = ""
    secret_env: str | None = None
    timeout_s: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every field checked here, where a receiver enters: a wrong type found at the first
        alert would stall delivery (docs/alerts.md)."""
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            shown = redact_url(self.url) if isinstance(self.url, str) else type(self.url).__name__
            raise ValueError(f"url: not an http(s) URL ({shown})")
        try:
            host = httpx.URL(self.url).host
        except (httpx.InvalidURL, ValueError, TypeError):
            host = ""
        if not host or _CONTROL.search(self.url):
            raise ValueError(f"url: not a valid URL ({redact_url(self.url)})")
        if not isinstance(self.name, str) or _CONTROL.search(self.name):
            raise ValueError("name: must be a string without control characters")
        if not isinstance(self.format, str) or self.format not in FORMATS:
            raise ValueError(f"format: must be one of {', '.join(FORMATS)}")
        if self.secret_env is not None and (
            not isinstance(self.secret_env, str) or not _ENV_NAME.fullmatch(self.secret_env)
        ):
            raise ValueError("secret_env: must name an environment variable")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= _MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s: must be a number of seconds in (0, {_MAX_TIMEOUT_S:g}]")
        if not isinstance(self.headers, dict):
            raise ValueError("headers: must be a mapping of header names to strings")
        for k, v in self.headers.items():
            if not isinstance(k, str) or not _HEADER_NAME.fullmatch(k):
                raise ValueError(f"headers: {str(k)[:40]!r} is not a header name")
            if not isinstance(v, str) or not v.isascii() or _CONTROL.search(v):
                raise ValueError(
                    f"headers.{k}: must be a string of printable ASCII (quote a number in YAML)"
                )

    @property
    def key(self) -> str:
        """How the receiver is named everywhere (API, metrics, logs, the outbox): its `name`, or
        its URL with everything that may be a secret redacted."""
        return self.name or redact_url(self.url)

    def secret(self) -> bytes | None:
        if not self.secret_env:
            return None
        value = os.environ.get(self.secret_env)
        if not value:
            raise ValueError(
                f"webhook {self.key}: environment variable {self.secret_env} is empty or unset"
            )
        return value.encode()


def redact_url(url: str) -> str:
    """`scheme://host[:port]/...#fingerprint`: no user, password, path or query (a Slack hook's
    path and an `?api_key=` are the secret), and a short hash that tells two receivers on one
    host apart."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "(not a URL)"
    hostport = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    return f"{scheme}://{hostport}/...#{digest}"


def receivers_from(items: object, where: str) -> list[Receiver]:
    """Receivers from a parsed config (a list of mappings), each field checked; `where` names
    the source in the one-line error."""
    if not isinstance(items, list):
        raise ValueError(f"{where}: expected a list of receivers")
    out = []
    for i, d in enumerate(items):
        if not isinstance(d, dict) or "url" not in d:
            raise ValueError(f"{where}: receiver {i} needs a url")
        name = d.get("name")
        shown = isinstance(name, str) and 0 < len(name) <= 60 and not _CONTROL.search(name)
        label = f"receiver {i}" + (f" ({name})" if shown else "")
        unknown = {str(k) for k in d} - FIELDS
        if unknown:
            raise ValueError(f"{where}: {label}: unknown keys {sorted(unknown)}")
        try:
            out.append(Receiver(**{str(k): v for k, v in d.items()}))
        except ValueError as e:
            raise ValueError(f"{where}: {label}: {e}") from None
    return out


def load_receivers(urls: list[str], config: Path | None) -> list[Receiver]:
    """`--webhook URL[,format]` flags plus a JSON or YAML file: a list of receiver objects."""
    out = []
    for item in urls:
        url, _, fmt = item.partition(",")
        try:
            out.append(Receiver(url, fmt or "json"))
        except ValueError as e:
            raise ValueError(f"--webhook {redact_url(url)}: {e}") from None
    if config is not None:
        try:
            text = config.read_text()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not text"
            raise ValueError(f"cannot read {config}: {why}") from None
        import yaml

        try:
            items = yaml.safe_load(text)
        except yaml.YAMLError as e:
            why = " ".join(str(e).split())[:300]
            raise ValueError(f"{config}: not YAML/JSON ({why})") from None
        out += receivers_from(items, str(config))
    for r in out:
        r.secret()  # fail at start, not at the first alert
    return out


def _iso(t: float | None) -> str:
    if t is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _slack_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(n: Notification, fmt: str, delivery_id: str, external_url: str) -> dict[str, Any]:
    a = n.alert
    labels = {"alertname": a.name, **a.labels}
    if fmt == "alertmanager":
        group = {k: v for k, v in labels.items() if k in ("alertname", "target", "model_name")}
        return {
            "version": "4",
            "groupKey": json.dumps(group, sort_keys=True),
            "truncatedAlerts": 0,
            "status": n.status,
            "receiver": "kvwatch",
            "groupLabels": group,
            "commonLabels": labels,
            "commonAnnotations": a.annotations,
            "externalURL": external_url,
            "alerts": [
                {
                    "status": n.status,
                    "labels": labels,
                    "annotations": a.annotations,
                    "startsAt": _iso(n.starts_at),
                    # firing: when Alertmanager (fed through its API) resolves it on its own if
                    # the sidecar is gone for good and no resolve ever comes
                    "endsAt": _iso(n.ends_at if n.status == "resolved" else n.valid_until),
                    "generatorURL": external_url + "/api/state",
                    "fingerprint": a.fingerprint,
                }
            ],
        }
    if fmt == "slack":
        icon = ":red_circle:" if n.status == "firing" else ":large_green_circle:"
        title = f"{icon} [{n.status.upper()}] {a.name}: {a.annotations.get('summary', '')}"
        text = _slack_escape(f"{title}\n{a.annotations.get('description', '')}")[:_SLACK_MAX]
        return {
            "text": _slack_escape(title)[:_SLACK_MAX],
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        }
    return {
        "delivery_id": delivery_id,
        "status": n.status,
        "repeat": n.repeat,
        "alertname": a.name,
        "labels": a.labels,
        "annotations": a.annotations,
        "fingerprint": a.fingerprint,
        "starts_at": _iso(n.starts_at),
        "ends_at": _iso(n.ends_at),
        "valid_until": _iso(n.valid_until),
    }


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """HMAC-SHA256 over `timestamp.body`: a captured delivery cannot be replayed later, since a
    receiver rejects a timestamp outside its window (docs/alerts.md)."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()


def _delivery_id(n: Notification) -> str:
    """Unique per notification, the same for every receiver and every retry."""
    t = n.ends_at if n.ends_at is not None else (time.time() if n.repeat else n.starts_at)
    return f"{n.alert.fingerprint}-{n.status}-{int(t * 1000)}"


def enqueue(
    outbox: Outbox, receivers: list[Receiver], notes: list[Notification], external_url: str
) -> None:
    for n in notes:
        delivery_id = _delivery_id(n)
        for r in receivers:
            payload = render(n, r.format, delivery_id, external_url)
            body = json.dumps({"delivery_id": delivery_id, "payload": payload})
            outbox.put(r.key, body.encode())


async def _deliver_one(client: httpx.AsyncClient, outbox: Outbox, r: Receiver) -> bool:
    """Try the receiver's oldest message; True if there may be more to send right away. The
    outbox is read and written in a worker thread: SQLite on a slow disk must not stall the
    event loop the scrapes run on."""
    msg = await asyncio.to_thread(outbox.head, r.key)
    if msg is None:
        return False
    now = time.time()
    if msg.next_at > now:
        return False
    wrapped = json.loads(msg.body)
    body = json.dumps(wrapped["payload"]).encode()
    headers = {
        "Content-Type": "application/json",
        DELIVERY_HEADER: wrapped["delivery_id"],
        **r.headers,
    }
    try:
        secret = r.secret()
        if secret is not None:
            stamp = int(time.time())
            headers[TIMESTAMP_HEADER] = str(stamp)
            headers[SIGNATURE_HEADER] = sign(secret, body, stamp)
        resp = await client.post(r.url, content=body, headers=headers, timeout=r.timeout_s)
        ok, error = 200 <= resp.status_code < 300, f"HTTP {resp.status_code}"
    except httpx.HTTPError as e:
        ok, error = False, f"{type(e).__name__}: {e}"
    except Exception as e:  # one attempt failed: the message stays and the loop goes on
        ok, error = False, f"{type(e).__name__}: {str(e)[:200]}"
    if ok:
        await asyncio.to_thread(outbox.delivered, msg.id)
        return True
    delay = backoff_s(msg.attempts + 1)
    log.warning("webhook %s: %s; retry %d in %.1f s", r.key, error, msg.attempts + 1, delay)
    await asyncio.to_thread(outbox.failed, msg.id, error, time.time() + delay)
    return False


async def deliver_forever(
    outbox: Outbox,
    receivers: list[Receiver],
    poll_s: float = 0.2,
    wake: asyncio.Event | None = None,
    beat: Callable[[], None] | None = None,
) -> None:
    """Sends the outbox in order per receiver, each receiver on its own (a slow or dead one
    never delays another); polls for retries that come due, and starts at once when `wake` is
    set (new notifications queued). `beat` is called after each round."""
    wake = wake or asyncio.Event()
    queued = {r.key: asyncio.Event() for r in receivers}

    async def fan_out() -> None:
        while True:
            await wake.wait()
            wake.clear()
            for e in queued.values():
                e.set()

    async def serve(client: httpx.AsyncClient, r: Receiver) -> None:
        while True:
            if not await _deliver_one(client, outbox, r):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queued[r.key].wait(), poll_s)
                queued[r.key].clear()
            if beat is not None:
                beat()

    async with httpx.AsyncClient() as client:
        await asyncio.gather(fan_out(), *(serve(client, r) for r in receivers))
