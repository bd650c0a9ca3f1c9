"""The sidecar's own HTTP endpoint: `/metrics` (kvwatch_*), `/healthz`, `/api/state`,
`/api/episodes` and `/api/readings` (JSON; the last for `kvwatch calibrate --sidecar`), and
`POST /api/events` (a load generator's stage marks: from loopback, or with the bearer token in
$KVWATCH_EVENTS_TOKEN where that is set).

Metrics are built from a state view at scrape time (a custom collector on our own registry),
with the names, types, labels and help of sidecar/contract/catalogue.py. A target that is down
exports `kvwatch_target_up 0` and no engine series: down is not zero. The connections are
outputs/http_endpoint.py's (it keeps answering under a flood of held connections).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.judge.episodes import Episode
from kvwatch.sidecar.outputs.http_endpoint import EndpointServer, Request, Response
from kvwatch.sidecar.state.views import StateView, TargetView, state_json

__all__ = ["StateCollector", "serve", "EVENTS_TOKEN_ENV", "events_refusal"]


def _family(m: cat.Metric) -> GaugeMetricFamily | CounterMetricFamily:
    cls = GaugeMetricFamily if m.type is cat.MetricType.GAUGE else CounterMetricFamily
    return cls(m.name, m.help, labels=list(m.labels))


class StateCollector(Collector):
    """Every family in the catalogue, filled from one state view at scrape time."""

    def __init__(self, view: Callable[[], StateView]) -> None:
        self._view = view
        self.server: EndpointServer | None = None  # its shed and handler-error counts

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
            add(cat.TIME_SCALE, url, t.time_scale or 1.0)
            add(cat.LOG_PREEMPTION_WARNINGS, url, t.log.preemption_warnings)
            for what, n in t.log.incidents_counted.items():
                add(cat.LOG_INCIDENTS, [t.target, what], n)
            for e in t.engines:
                labels = [t.target, e.model_name, e.engine]
                sig = e.signals
                add(cat.PREEMPTIONS_OBSERVED, labels, sig.preemptions_observed)
                for cause, c in e.stalls.items():
                    add(cat.STALLS_OBSERVED, [*labels, cause], c.stalls)
                    add(cat.STALL_SECONDS_OBSERVED, [*labels, cause], c.seconds)
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
                losing = e.prefix_cache_thrashing_since_unix is not None
                add(cat.PREFIX_CACHE_THRASHING, labels, 1.0 if losing else 0.0)
                if e.episode is not None:
                    add(cat.EPISODE_PREEMPTIONS, labels, e.episode.preemptions)
                    add(cat.EPISODE_RECOMPUTED_TOKENS, labels, e.episode.tokens_recomputed)
            _kv_events(t, add)
        if (f := v.fleet_prefix) is not None:
            fleet = (
                (cat.FLEET_PREFIX_DUPLICATED_RATIO, f.duplicated_share),
                (cat.FLEET_PREFIX_POOLED_HIT_RATIO, f.pooled_hit_ratio),
                (cat.FLEET_PREFIX_REPLICAS_HIT_RATIO, f.replicas_hit_ratio),
            )
            for m, value in fleet:
                if value is not None:
                    add(m, [f.model_name], value)
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


def _kv_events(t: TargetView, add: Callable[[cat.Metric, list[str], float], None]) -> None:
    """The KV event feed's counts and, once the target's engine is known, its curve."""
    feed, curve = t.kv_events, t.prefix_curve
    if feed is None or curve is None:
        return
    for outcome, n in (("received", feed.batches - feed.replayed), ("replayed", feed.replayed),
                       ("missed", feed.missed), ("refused", feed.refused)):  # fmt: skip
        add(cat.KV_EVENT_BATCHES, [t.target, outcome], n)
    present = [e for e in t.engines if e.present]
    if not (t.up and present):
        return
    labels = [t.target, present[0].model_name, present[0].engine]
    add(cat.PREFIX_CACHE_RESTORED_BLOCKS, labels, curve.restored_blocks)
    for point in curve.points:
        factor = f"{point.factor:g}x" if point.factor is not None else ""
        add(cat.PREFIX_CACHE_HIT_RATIO_AT_SIZE, [*labels, str(point.blocks), factor],
            point.hit_ratio)  # fmt: skip
    if curve.ideal_hit_ratio is not None:
        add(cat.PREFIX_CACHE_IDEAL_HIT_RATIO, labels, curve.ideal_hit_ratio)
    if curve.working_set_blocks is not None:
        add(cat.PREFIX_CACHE_WORKING_SET_BLOCKS, labels, curve.working_set_blocks)


EVENTS_TOKEN_ENV = "KVWATCH_EVENTS_TOKEN"


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


def _responder(
    registry: CollectorRegistry,
    view: Callable[[], StateView],
    stale_after_s: float,
    episodes: Callable[[], list[Episode]],
    on_load_event: Callable[[object], None] | None,
    refuse_event: Callable[[str | None], tuple[int, str] | None],
    readings: Callable[[], dict[str, object]] | None = None,
) -> Callable[[Request], Response]:
    def get(path: str) -> Response:
        if path == "/metrics":
            return Response(200, generate_latest(registry), "text/plain; version=0.0.4")
        if path == "/healthz":
            v = view()
            failing = v.failing_loops
            ok = v.heartbeat_age_s <= stale_after_s and not failing
            doc = {
                "ok": ok,
                "heartbeat_age_s": round(v.heartbeat_age_s, 3),
                "failing_loops": list(failing),
            }
            return Response(200 if ok else 503, json.dumps(doc).encode(), "application/json")
        if path == "/api/state":
            body = json.dumps(state_json(view()), indent=1, default=str).encode()
            return Response(200, body, "application/json")
        if path == "/api/episodes":
            body = json.dumps([e.to_dict() for e in episodes()], indent=1).encode()
            return Response(200, body, "application/json")
        if path == "/api/readings" and readings is not None:
            return Response(200, json.dumps(readings()).encode(), "application/json")
        return Response(
            404, b"not found: try /metrics, /healthz, /api/state, /api/episodes, /api/readings\n"
        )

    def post(req: Request) -> Response:
        if req.path != "/api/events" or on_load_event is None:
            return Response(404, b"POST /api/events only\n")
        refusal = refuse_event(req.headers.get("authorization"))
        if refusal is not None:
            return Response(refusal[0], refusal[1].encode() + b"\n")
        try:
            if not req.body:
                raise ValueError("body must be 1 byte to 64 KiB of JSON")
            on_load_event(json.loads(req.body))
        except (ValueError, TypeError, RecursionError) as e:
            return Response(400, f"bad event: {str(e)[:200]}\n".encode())
        return Response(204, b"")

    def respond(req: Request) -> Response:
        if req.method == "GET":
            return get(req.path)
        if req.method == "POST":
            return post(req)
        return Response(405, b"GET, or POST /api/events\n")

    return respond


def serve(
    host: str,
    port: int,
    view: Callable[[], StateView],
    stale_after_s: float,
    episodes: Callable[[], list[Episode]] = list,
    on_load_event: Callable[[object], None] | None = None,
    events_token: str | None = None,
    readings: Callable[[], dict[str, object]] | None = None,
) -> EndpointServer:
    """Start the endpoint in a daemon thread; `server.shutdown()` stops it. `POST /api/events`
    needs `Authorization: Bearer <events_token>` when a token is given, and is refused beyond
    loopback without one."""
    registry = CollectorRegistry(auto_describe=False)
    collector = StateCollector(view)
    registry.register(collector)
    refusal = functools.partial(events_refusal, events_token, _is_loopback(host))
    respond = _responder(registry, view, stale_after_s, episodes, on_load_event, refusal, readings)
    server = EndpointServer(host, port, respond)
    collector.server = server
    return server
