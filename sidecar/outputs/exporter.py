"""The sidecar's own HTTP endpoint: `/metrics` (kvwatch_*), `/healthz`, `/api/state` and
`/api/episodes` (JSON), and `POST /api/events` (a load generator's stage marks: from loopback,
or with the bearer token in $KVWATCH_EVENTS_TOKEN where that is set).

Metrics are built from a state view at scrape time (a custom collector on our own registry),
with the names, types, labels and help of sidecar/contract/catalogue.py. A target that is down
exports `kvwatch_target_up 0` and no engine series: down is not zero.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.judge.episodes import Episode
from kvwatch.sidecar.state.views import StateView, state_json

__all__ = ["StateCollector", "serve", "EVENTS_TOKEN_ENV", "BoundedHTTPServer", "events_refusal"]


def _family(m: cat.Metric) -> GaugeMetricFamily | CounterMetricFamily:
    cls = GaugeMetricFamily if m.type is cat.MetricType.GAUGE else CounterMetricFamily
    return cls(m.name, m.help, labels=list(m.labels))


class StateCollector(Collector):
    """Every family in the catalogue, filled from one state view at scrape time."""

    def __init__(self, view: Callable[[], StateView]) -> None:
        self._view = view
        self.server: BoundedHTTPServer | None = None  # its shed and handler-error counts

    def collect(self) -> Iterator[Metric]:
        v = self._view()
        fam = {m.name: _family(m) for m in cat.METRICS}

        def add(m: cat.Metric, labels: list[str], value: float) -> None:
            fam[m.name].add_metric(labels, value)

        for t in v.targets:
            url = [t.target]
            if t.up is not None:
                add(cat.TARGET_UP, url, 1.0 if t.up else 0.0)
            if t.liveness is not None:
                add(cat.ENGINE_ALIVE, url, 1.0 if t.liveness.status == "alive" else 0.0)
            if t.vllm_metrics_present is not None:
                add(cat.VLLM_METRICS_PRESENT, url, 1.0 if t.vllm_metrics_present else 0.0)
            add(cat.SCRAPES, url, t.scrapes)
            for reason, n in t.scrape_errors.items():
                add(cat.SCRAPE_ERRORS, [t.target, reason], n)
            add(cat.EXPOSITION_PARSE_ERRORS, url, t.parse_errors)
            for reason, n in t.rejected_samples.items():
                add(cat.REJECTED_SAMPLES, [t.target, reason], n)
            if t.last_scrape_duration_s is not None:
                add(cat.SCRAPE_DURATION, url, t.last_scrape_duration_s)
            add(cat.LOG_PREEMPTION_WARNINGS, url, t.log.preemption_warnings)
            for what, n in t.log.incidents_counted.items():
                add(cat.LOG_INCIDENTS, [t.target, what], n)
            for e in t.engines:
                labels = [t.target, e.model_name, e.engine]
                sig = e.signals
                add(cat.PREEMPTIONS_OBSERVED, labels, sig.preemptions_observed)
                add(cat.COUNTER_RESETS, labels, sig.counter_resets)
                add(cat.THRASHING_EPISODES, labels, e.episodes)
                if not (t.up and e.present):
                    continue  # stale: say nothing rather than zeros
                for m, field in cat.ENGINE_GAUGES:
                    value = getattr(sig, field)
                    if value is not None:
                        add(m, labels, value)
                for st in cat.STATES:
                    add(cat.STATE, [*labels, st], 1.0 if e.state == st else 0.0)
                add(cat.STATE_LEVEL, labels, int(e.level))
                imminent = e.exhaustion_imminent_since_unix is not None
                add(cat.KV_EXHAUSTION_IMMINENT, labels, 1.0 if imminent else 0.0)
                if e.episode is not None:
                    add(cat.EPISODE_PREEMPTIONS, labels, e.episode.preemptions)
                    add(cat.EPISODE_RECOMPUTED_TOKENS, labels, e.episode.tokens_recomputed)
        counts: dict[str, int] = {}
        for a in v.alerting.firing:
            counts[a.name] = counts.get(a.name, 0) + 1
        for name, n in counts.items():
            add(cat.ALERTS_FIRING, [name], n)
        for r, box in v.alerting.webhooks.items():
            add(cat.WEBHOOK_PENDING, [r], box.pending)
            add(cat.WEBHOOK_DELIVERED, [r], box.delivered)
            add(cat.WEBHOOK_DROPPED, [r], box.dropped)
        for name in v.load_stages:
            add(cat.LOAD_STAGE, [name], 1.0)
        for loop, health in v.loops.items():
            add(cat.INTERNAL_ERRORS, [loop], health.errors)
        log = v.log
        if log is not None:
            add(cat.LOG_LINES, [log.source], log.stats.lines)
            add(cat.LOG_OVERSIZED_LINES, [log.source], log.stats.oversized_lines)
            add(cat.LOG_ROTATIONS, [log.source], log.stats.rotations + log.stats.truncations)
        if self.server is not None:
            add(cat.HTTP_CONNECTIONS_SHED, [], self.server.shed)
            add(cat.HTTP_HANDLER_ERRORS, [], self.server.handler_errors)
        for m in cat.METRICS:
            # a log family only when a log is followed, as before; the rest always
            if log is None and m in (cat.LOG_LINES, cat.LOG_OVERSIZED_LINES, cat.LOG_ROTATIONS):
                continue
            yield fam[m.name]


EVENTS_TOKEN_ENV = "KVWATCH_EVENTS_TOKEN"
_CLIENT_TIMEOUT_S = 5.0
_LOG_EVERY_S = 60.0
log = logging.getLogger("kvwatch.http")


class BoundedHTTPServer(HTTPServer):
    """A fixed pool of handler threads and a short queue in front of it: a flood of connections
    costs a few threads, never one each, and past the queue a connection is closed at once
    (counted in `shed`). A client that goes away mid-answer is no traceback."""

    request_queue_size = socket.SOMAXCONN  # the kernel's accept queue: 5 would drop handshakes

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        workers: int = 8,
        queue: int = 128,
    ) -> None:
        super().__init__(address, handler)
        self.shed = 0
        self.handler_errors = 0
        self._logged_at = -math.inf
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvwatch-http")
        self._slots = threading.BoundedSemaphore(workers + queue)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shed += 1
            self.shutdown_request(request)
            return
        try:
            self._pool.submit(self._serve_one, request, client_address)
        except RuntimeError:  # shutting down
            self._slots.release()
            self.shutdown_request(request)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (ConnectionError, TimeoutError):
            pass  # the client reset, left or timed out: nothing of ours broke
        except Exception as e:  # a handler's bug: counted and said, never only a dropped socket
            self.handler_errors += 1
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._logged_at = now
                log.error(
                    "the HTTP endpoint's handler raised %s: %s (%d so far; "
                    "kvwatch_http_handler_errors_total)",
                    type(e).__name__, str(e)[:200], self.handler_errors,
                )  # fmt: skip
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # BrokenPipe and resets: the client left; nothing to print

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def events_refusal(
    token: str | None, loopback: bool, authorization: str | None
) -> tuple[int, str] | None:
    """Why a `POST /api/events` is refused (HTTP status, text), or None to accept it."""
    if token is None:
        if loopback:
            return None
        return 403, f"events from beyond loopback need {EVENTS_TOKEN_ENV} set on the sidecar"
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return 401, "a bearer token is needed (Authorization: Bearer <token>)"
    return None


def _handler(
    registry: CollectorRegistry,
    view: Callable[[], StateView],
    stale_after_s: float,
    episodes: Callable[[], list[Episode]],
    on_load_event: Callable[[object], None] | None,
    refuse_event: Callable[[str | None], tuple[int, str] | None],
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = _CLIENT_TIMEOUT_S  # a client that sends nothing (or trickles) is dropped

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif path == "/healthz":
                v = view()
                failing = v.failing_loops
                ok = v.heartbeat_age_s <= stale_after_s and not failing
                doc = {
                    "ok": ok,
                    "heartbeat_age_s": round(v.heartbeat_age_s, 3),
                    "failing_loops": list(failing),
                }
                body = json.dumps(doc).encode()
                self._send(200 if ok else 503, body, "application/json")
            elif path == "/api/state":
                body = json.dumps(state_json(view()), indent=1, default=str).encode()
                self._send(200, body, "application/json")
            elif path == "/api/episodes":
                body = json.dumps([e.to_dict() for e in episodes()], indent=1).encode()
                self._send(200, body, "application/json")
            else:
                msg = b"not found: try /metrics, /healthz, /api/state, /api/episodes\n"
                self._send(404, msg, "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] != "/api/events" or on_load_event is None:
                self._send(404, b"POST /api/events only\n", "text/plain")
                return
            refusal = refuse_event(self.headers.get("Authorization"))
            if refusal is not None:
                self._send(refusal[0], refusal[1].encode() + b"\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= 65536:
                    raise ValueError("body must be 1 byte to 64 KiB of JSON")
                on_load_event(json.loads(self.rfile.read(length)))
            except (ValueError, TypeError, RecursionError) as e:
                self._send(400, f"bad event: {str(e)[:200]}\n".encode(), "text/plain")
                return
            self._send(204, b"", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: the sidecar's stdout may carry vLLM's own log

    return Handler


def serve(
    host: str,
    port: int,
    view: Callable[[], StateView],
    stale_after_s: float,
    episodes: Callable[[], list[Episode]] = list,
    on_load_event: Callable[[object], None] | None = None,
    events_token: str | None = None,
) -> BoundedHTTPServer:
    """Start the endpoint in a daemon thread; `server.shutdown()` stops it. `POST /api/events`
    needs `Authorization: Bearer <events_token>` when a token is given, and is refused beyond
    loopback without one."""
    registry = CollectorRegistry(auto_describe=False)
    collector = StateCollector(view)
    registry.register(collector)
    refusal = functools.partial(events_refusal, events_token, _is_loopback(host))
    handler = _handler(registry, view, stale_after_s, episodes, on_load_event, refusal)
    server = BoundedHTTPServer((host, port), handler)
    collector.server = server
    threading.Thread(target=server.serve_forever, name="kvwatch-http", daemon=True).start()
    return server
