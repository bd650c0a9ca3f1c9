"""The sidecar's own endpoint: `/metrics` (kvwatch_*), `/healthz` and `/api/state` (JSON).

Metrics are built from a state snapshot at scrape time (a custom collector on our own registry).
A target that is down exports `kvwatch_target_up 0` and no engine series: down is not zero.
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

__all__ = ["StateCollector", "serve", "ENGINE_GAUGES"]

_ENGINE_LABELS = ["target", "model_name", "engine"]
_STATES = ("ok", "pressure", "saturated", "thrashing")

# (metric name, signal key, help). Windows are in the help text and the docs.
ENGINE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("kvwatch_kv_cache_usage_ratio", "kv_usage", "KV cache blocks in use, 0..1"),
    ("kvwatch_kv_cache_capacity_blocks", "capacity_blocks", "KV cache size in blocks"),
    ("kvwatch_kv_cache_capacity_tokens", "capacity_tokens", "KV cache size in tokens"),
    ("kvwatch_kv_cache_block_size_tokens", "block_size", "tokens per KV block"),
    ("kvwatch_kv_cache_free_blocks", "free_blocks", "KV headroom in blocks"),
    ("kvwatch_kv_cache_free_tokens", "free_tokens", "KV headroom in tokens"),
    ("kvwatch_requests_running", "running", "requests in the running batch"),
    ("kvwatch_requests_waiting", "waiting", "requests waiting"),
    (
        "kvwatch_requests_waiting_capacity",
        "waiting_capacity",
        "requests waiting for KV capacity (preempted ones included)",
    ),
    (
        "kvwatch_block_demand_per_step",
        "block_demand_per_step",
        "new KV blocks the running batch asks for per decode step (running / block_size)",
    ),
    (
        "kvwatch_seconds_to_kv_exhaustion",
        "seconds_to_exhaustion",
        "free KV tokens / generation tokens per second (short window)",
    ),
    (
        "kvwatch_generation_tokens_per_second",
        "generation_tokens_per_s",
        "generation throughput over the short window",
    ),
    (
        "kvwatch_prompt_tokens_per_second",
        "prompt_tokens_per_s",
        "prompt throughput over the short window",
    ),
    (
        "kvwatch_preemptions_per_second_short",
        "preemptions_per_s_short",
        "preemptions per second over the short window",
    ),
    (
        "kvwatch_preemptions_per_second_long",
        "preemptions_per_s_long",
        "preemptions per second over the long window",
    ),
    (
        "kvwatch_repeat_preempted_requests",
        "repeat_preempted_long",
        "finished requests preempted 2+ times in the long window",
    ),
)


class StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        up = GaugeMetricFamily(
            "kvwatch_target_up", "1 if the last scrape worked", labels=["target"]
        )
        present = GaugeMetricFamily(
            "kvwatch_vllm_metrics_present",
            "1 if the target exports vLLM engine metrics (0: e.g. --disable-log-stats)",
            labels=["target"],
        )
        scrapes = CounterMetricFamily("kvwatch_scrapes", "scrapes attempted", labels=["target"])
        errors = CounterMetricFamily(
            "kvwatch_scrape_errors", "failed scrapes by reason", labels=["target", "reason"]
        )
        parse_errors = CounterMetricFamily(
            "kvwatch_exposition_parse_errors", "unreadable sample lines", labels=["target"]
        )
        duration = GaugeMetricFamily(
            "kvwatch_scrape_duration_seconds", "last scrape duration", labels=["target"]
        )
        observed = CounterMetricFamily(
            "kvwatch_preemptions_observed",
            "preemptions seen since the sidecar started, corrected for vLLM restarts",
            labels=_ENGINE_LABELS,
        )
        resets = CounterMetricFamily(
            "kvwatch_counter_resets", "vLLM counter resets seen (restarts)", labels=_ENGINE_LABELS
        )
        warnings = CounterMetricFamily(
            "kvwatch_log_preemption_warnings", "V0 preemption warnings read", labels=["target"]
        )
        state = GaugeMetricFamily(
            "kvwatch_state",
            "1 for the engine's current state (ok, pressure, saturated, thrashing), else 0",
            labels=[*_ENGINE_LABELS, "state"],
        )
        level = GaugeMetricFamily(
            "kvwatch_state_level",
            "0 ok, 1 pressure, 2 saturated, 3 thrashing",
            labels=_ENGINE_LABELS,
        )
        episodes = CounterMetricFamily(
            "kvwatch_thrashing_episodes",
            "thrashing episodes begun (kept across sidecar restarts)",
            labels=_ENGINE_LABELS,
        )
        ep_pre = GaugeMetricFamily(
            "kvwatch_episode_preemptions",
            "preemptions in the current thrashing episode",
            labels=_ENGINE_LABELS,
        )
        ep_tok = GaugeMetricFamily(
            "kvwatch_episode_recomputed_tokens",
            "estimated tokens recomputed in the current thrashing episode",
            labels=_ENGINE_LABELS,
        )
        gauges = {
            name: GaugeMetricFamily(name, doc, labels=_ENGINE_LABELS)
            for name, _, doc in ENGINE_GAUGES
        }
        for t in snap["targets"]:
            url = t["target"]
            if t["up"] is not None:
                up.add_metric([url], 1.0 if t["up"] else 0.0)
            if t["vllm_metrics_present"] is not None:
                present.add_metric([url], 1.0 if t["vllm_metrics_present"] else 0.0)
            scrapes.add_metric([url], t["scrapes"])
            for reason, n in t["scrape_errors"].items():
                errors.add_metric([url, reason], n)
            parse_errors.add_metric([url], t["parse_errors"])
            if t["last_scrape_duration_s"] is not None:
                duration.add_metric([url], t["last_scrape_duration_s"])
            warnings.add_metric([url], t["log"]["preemption_warnings"])
            for e in t["engines"]:
                labels = [url, e["model_name"], e["engine"]]
                sig = e["signals"]
                observed.add_metric(labels, sig["preemptions_observed"])
                resets.add_metric(labels, sig["counter_resets"])
                episodes.add_metric(labels, e["episodes"])
                if not (t["up"] and e["present"]):
                    continue  # stale: say nothing rather than zeros
                for name, key, _ in ENGINE_GAUGES:
                    if sig[key] is not None:
                        gauges[name].add_metric(labels, sig[key])
                for st in _STATES:
                    state.add_metric([*labels, st], 1.0 if e["state"] == st else 0.0)
                level.add_metric(labels, e["state_level"])
                if e["episode"] is not None:
                    ep_pre.add_metric(labels, e["episode"]["preemptions"])
                    ep_tok.add_metric(labels, e["episode"]["tokens_recomputed"])
        yield from (
            up,
            present,
            scrapes,
            errors,
            parse_errors,
            duration,
            observed,
            resets,
            warnings,
            state,
            level,
            episodes,
            ep_pre,
            ep_tok,
        )
        yield from gauges.values()
        yield from _alerting_families(snap.get("alerting") or {})
        stage = GaugeMetricFamily(
            "kvwatch_load_stage",
            "1 while a load generator stage runs (for annotations)",
            labels=["stage"],
        )
        for name in (snap.get("load") or {}).get("stages", {}):
            stage.add_metric([name], 1.0)
        yield stage
        log = snap["log"]
        if log is not None:
            lines = CounterMetricFamily("kvwatch_log_lines", "log lines read", labels=["source"])
            lines.add_metric([log["source"]], log["lines"])
            over = CounterMetricFamily(
                "kvwatch_log_oversized_lines", "log lines dropped as too long", labels=["source"]
            )
            over.add_metric([log["source"]], log["oversized_lines"])
            rot = CounterMetricFamily(
                "kvwatch_log_rotations", "log rotations and truncations followed", labels=["source"]
            )
            rot.add_metric([log["source"]], log["rotations"] + log["truncations"])
            yield from (lines, over, rot)


def _alerting_families(alerting: dict[str, Any]) -> Iterator[Metric]:
    firing = GaugeMetricFamily(
        "kvwatch_alerts_firing", "the sidecar's own alerts now firing", labels=["alertname"]
    )
    counts: dict[str, int] = {}
    for a in alerting.get("firing", []):
        counts[a["name"]] = counts.get(a["name"], 0) + 1
    for name, n in counts.items():
        firing.add_metric([name], n)
    pending = GaugeMetricFamily(
        "kvwatch_webhook_pending", "notifications not yet delivered", labels=["receiver"]
    )
    delivered = CounterMetricFamily(
        "kvwatch_webhook_delivered", "notifications delivered", labels=["receiver"]
    )
    dropped = CounterMetricFamily(
        "kvwatch_webhook_dropped", "notifications dropped from a full outbox", labels=["receiver"]
    )
    for r, st in alerting.get("webhooks", {}).items():
        pending.add_metric([r], st["pending"])
        delivered.add_metric([r], st["delivered"])
        dropped.add_metric([r], st["dropped"])
    yield from (firing, pending, delivered, dropped)


def _handler(
    registry: CollectorRegistry,
    snapshot: Callable[[], dict[str, Any]],
    stale_after_s: float,
    episodes: Callable[[], list[dict[str, Any]]],
    on_load_event: Callable[[dict[str, Any]], None] | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif path == "/healthz":
                age = snapshot()["heartbeat_age_s"]
                ok = age <= stale_after_s
                body = json.dumps({"ok": ok, "heartbeat_age_s": round(age, 3)}).encode()
                self._send(200 if ok else 503, body, "application/json")
            elif path == "/api/state":
                body = json.dumps(snapshot(), indent=1, default=str).encode()
                self._send(200, body, "application/json")
            elif path == "/api/episodes":
                body = json.dumps(episodes(), indent=1).encode()
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
    snapshot: Callable[[], dict[str, Any]],
    stale_after_s: float,
    episodes: Callable[[], list[dict[str, Any]]] = list,
    on_load_event: Callable[[dict[str, Any]], None] | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; `server.shutdown()` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(snapshot))
    handler = _handler(registry, snapshot, stale_after_s, episodes, on_load_event)
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kvwatch-http", daemon=True).start()
    return server
