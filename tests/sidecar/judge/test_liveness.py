"""An engine dead or stuck while its API answers, apart from target down: from /health, from
the followed log, and from requests that get no token; exported and alerted on."""

from __future__ import annotations

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.liveness import Status
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.outputs.alerting import active_alerts
from kvwatch.sidecar.state.sidecar_state import SidecarState

URL = "http://a"
DEATH = (
    "(EngineCore pid=7) ERROR 12-01 10:00:05 [core.py:1] EngineCore encountered a fatal error.",
    "(EngineCore pid=7) ERROR 12-01 10:00:05 [core.py:1] Traceback (most recent call last):",
    "(EngineCore pid=7) ERROR 12-01 10:00:05 [core.py:1] RuntimeError: CUDA error: illegal memory",
)
BANNER = "(APIServer pid=1) INFO 12-01 10:01:00 [api_utils.py:347]  █  version 0.32.0"


def body(gen: float, running: int = 3, waiting: int = 2) -> str:
    return (
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="40"} 1\n'
    )


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def state() -> tuple[SidecarState, Clock]:
    clock = Clock()
    return SidecarState([URL], Thresholds(), wall_clock=clock), clock


def scrape(s: SidecarState, clock: Clock, text: str | None, at: float) -> None:
    clock.t = 1000.0 + at
    out = (
        ScrapeOutcome(0.01, parse_exposition(text))
        if text is not None
        else ScrapeOutcome(0.01, error_reason="connect", error="refused")
    )
    s.record_scrape(URL, at, out)


def liveness(s: SidecarState):  # type: ignore[no-untyped-def]
    (t,) = s.view(0.0 if s.heartbeat is None else s.heartbeat).targets
    return t.liveness


class TestLiveness:
    def test_alive_while_tokens_come(self) -> None:
        s, clock = state()
        for i in range(100):
            scrape(s, clock, body(gen=10.0 * i), float(i))
        assert liveness(s).status is Status.ALIVE

    def test_stuck_when_requests_get_no_token(self) -> None:
        s, clock = state()
        scrape(s, clock, body(gen=5), 0.0)
        for i in range(1, 59):
            scrape(s, clock, body(gen=10), float(i))
        assert liveness(s).status is Status.ALIVE  # 58 s without a token: not yet
        scrape(s, clock, body(gen=10), 62.0)
        lv = liveness(s)
        assert lv.status is Status.STUCK and "no token generated for 61 s" in lv.reason
        # an idle server generates nothing and is not stuck
        scrape(s, clock, body(gen=10, running=0, waiting=0), 63.0)
        assert liveness(s).status is Status.ALIVE

    def test_dead_when_health_fails_while_metrics_answer(self) -> None:
        s, clock = state()
        scrape(s, clock, body(gen=5), 0.0)
        s.record_health(URL, 0.0, False, "HTTP 503")
        lv = liveness(s)
        assert lv.status is Status.DEAD and "HTTP 503" in lv.reason and lv.since_unix == 1000.0
        s.record_health(URL, 1.0, True)
        assert liveness(s).status is Status.ALIVE

    def test_dead_from_the_log_when_the_api_is_gone_and_a_restart_clears_it(self) -> None:
        s, clock = state()
        s.log_target = URL
        scrape(s, clock, body(gen=5), 0.0)
        s.record_log_lines(list(DEATH))
        assert liveness(s).status is Status.ALIVE  # the API still answers /health: wait
        scrape(s, clock, None, 6.0)  # vLLM's API server exits ~5 s after its engine
        lv = liveness(s)
        assert lv.status is Status.DEAD and "engine_death at 12-01 10:00:05" in lv.reason
        assert "RuntimeError: CUDA error" in lv.reason
        s.record_log_lines([BANNER])
        scrape(s, clock, body(gen=0, running=0, waiting=0), 70.0)
        assert liveness(s).status is Status.ALIVE

    def test_down_with_nothing_in_the_log_is_unknown_not_dead(self) -> None:
        s, clock = state()
        scrape(s, clock, None, 0.0)
        assert liveness(s) is None


class TestAlert:
    def test_engine_dead_fires_after_its_wait_on_both_paths_texts(self) -> None:
        th = Thresholds()
        s, clock = state()
        scrape(s, clock, body(gen=5), 0.0)
        s.record_health(URL, 0.0, False, "HTTP 503")
        early = active_alerts(s.view(0.0), th, 1000.0 + 10)
        assert not [a for a in early.active if a.name == "KvwatchEngineDead"]
        assert early.holding
        late = active_alerts(s.view(0.0), th, 1000.0 + th.engine_dead_after_s)
        (a,) = [a for a in late.active if a.name == "KvwatchEngineDead"]
        assert a.labels["target"] == URL
        assert (
            "It is dead: the API answers /metrics but /health failed"
            in a.annotations["description"]
        )

    def test_exported_as_engine_alive(self) -> None:
        from prometheus_client import CollectorRegistry, generate_latest

        from kvwatch.sidecar.outputs.exporter import StateCollector

        s, clock = state()
        scrape(s, clock, body(gen=5), 0.0)
        s.record_health(URL, 0.0, False, "HTTP 503")
        reg = CollectorRegistry(auto_describe=False)
        reg.register(StateCollector(lambda: s.view(0.0)))
        assert 'kvwatch_engine_alive{target="http://a"} 0.0' in generate_latest(reg).decode()


class TestHealthProbe:
    """`check_health` against a FAKE server answering each status (the real 503 of a dead
    engine is the live test's)."""

    def test_only_a_server_error_or_no_answer_fails(self) -> None:
        import asyncio
        from http.server import BaseHTTPRequestHandler

        import httpx

        from kvwatch.sidecar.metrics.scrape import check_health
        from tests.http_server import serving

        class FakeHealth(BaseHTTPRequestHandler):
            status = 200

            def do_GET(self) -> None:  # noqa: N802
                assert self.path == "/health"
                self.send_response(FakeHealth.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        async def probe(url: str) -> tuple[bool, str]:
            async with httpx.AsyncClient() as client:
                return await check_health(client, url + "/metrics", 2.0)

        with serving(FakeHealth) as url:
            for status, ok in ((200, True), (404, True), (401, True), (503, False), (500, False)):
                FakeHealth.status = status
                assert asyncio.run(probe(url)) == (ok, f"HTTP {status}"), status
        assert asyncio.run(probe("http://127.0.0.1:9"))[0] is False  # nobody there
