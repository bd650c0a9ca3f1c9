"""The sidecar's own endpoint: `/metrics` (kvwatch_*), `/healthz` and `/api/state` (JSON).

Metrics are built from a state view at scrape time (a custom collector on our own registry),
with the names, types, labels and help of sidecar/catalogue.py. A target that is down exports
`kvwatch_target_up 0` and no engine series: down is not zero.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.sidecar import catalogue as cat
from kvwatch.sidecar.episodes import Episode
from kvwatch.sidecar.views import StateView, state_json

__all__ = ["StateCollector", "serve"]


def _family(m: cat.Metric) -> GaugeMetricFamily | CounterMetricFamily:
    cls = GaugeMetricFamily if m.type is cat.MetricType.GAUGE else CounterMetricFamily
    return cls(m.name, m.help, labels=list(m.labels))


class StateCollector(Collector):
    """Every family in the catalogue, filled from one state view at scrape time."""

    def __init__(self, view: Callable[[], StateView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        v = self._view()
        fam = {m.name: _family(m) for m in cat.METRICS}

        def add(m: cat.Metric, labels: list[str], value: float) -> None:
            fam[m.name].add_metric(labels, value)

        for t in v.targets:
            url = [t.target]
            if t.up is not None:
                add(cat.TARGET_UP, url, 1.0 if t.up else 0.0)
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
        for m in cat.METRICS:
            # a log family only when a log is followed, as before; the rest always
            if log is None and m in (cat.LOG_LINES, cat.LOG_OVERSIZED_LINES, cat.LOG_ROTATIONS):
                continue
            yield fam[m.name]


def _handler(
    registry: CollectorRegistry,
    view: Callable[[], StateView],
    stale_after_s: float,
    episodes: Callable[[], list[Episode]],
    on_load_event: Callable[[dict[str, Any]], None] | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
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
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= 65536:
                    raise ValueError("body must be 1 byte to 64 KiB of JSON")
                on_load_event(json.loads(self.rfile.read(length)))
            except (ValueError, TypeError) as e:
                self._send(400, f"bad event: {e}\n".encode(), "text/plain")
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
    on_load_event: Callable[[dict[str, Any]], None] | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; `server.shutdown()` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(view))
    handler = _handler(registry, view, stale_after_s, episodes, on_load_event)
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kvwatch-http", daemon=True).start()
    return server
