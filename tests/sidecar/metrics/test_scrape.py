from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.sidecar.metrics.scrape import ScrapeOutcome, metrics_url, scrape_once
from kvwatch.sidecar.outputs.exporter import StateCollector
from kvwatch.sidecar.state.sidecar_state import SidecarState
from tests.sidecar.fakes import raw_http_server


def _scrape(url: str, transport: httpx.AsyncBaseTransport | None = None, timeout: float = 1.0
            ) -> ScrapeOutcome:  # fmt: skip
    async def go() -> ScrapeOutcome:
        async with httpx.AsyncClient(transport=transport) as client:
            return await scrape_once(client, url, timeout)

    return asyncio.run(go())


class TestMetricsUrl:
    def test_forms(self) -> None:
        assert metrics_url("http://h:8000") == "http://h:8000/metrics"
        assert metrics_url("http://h:8000/") == "http://h:8000/metrics"
        assert metrics_url("http://h:8000/custom/metrics") == "http://h:8000/custom/metrics"


class TestScrapeFailures:
    def test_http_500(self) -> None:
        t = httpx.MockTransport(lambda r: httpx.Response(500, text="boom"))
        out = _scrape("http://x/metrics", t)
        assert out.exposition is None and out.error_reason == "http_5xx" and "500" in str(out.error)

    def test_malformed_body_is_parsed_with_errors_counted(self, data_dir: Path) -> None:
        body = (data_dir / "vllm-0.32-metrics-busy.txt").read_text()[:30000]
        body += '\nvllm:num_requests_running{model_name="m"\n\x00\x01binary\n'
        t = httpx.MockTransport(lambda r: httpx.Response(200, text=body))
        out = _scrape("http://x/metrics", t)
        assert out.exposition is not None and out.exposition.error_count >= 1

    def test_connection_refused(self) -> None:
        with raw_http_server(b"") as url:
            pass  # closed: nothing listens there any more
        out = _scrape(url + "/metrics")
        assert out.error_reason == "connect"

    def test_hanging_target_times_out(self) -> None:
        with raw_http_server(None) as url:
            out = _scrape(url + "/metrics", timeout=0.5)
        assert out.error_reason == "timeout" and out.duration_s < 5

    def test_body_cut_mid_way(self) -> None:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nvllm:num_requests_running 1\n"
        with raw_http_server(reply) as url:
            out = _scrape(url + "/metrics")
        assert out.error_reason == "transport"


class TestStateAndExporter:
    def _export(self, state: SidecarState, now: float) -> str:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(StateCollector(lambda: state.view(now)))
        return generate_latest(reg).decode()

    def test_down_target_is_down_not_zero(self, data_dir: Path) -> None:
        from kvwatch.sidecar.metrics.exposition import parse_exposition

        body = (data_dir / "vllm-0.32-metrics-busy.txt").read_text()
        state = SidecarState(["http://a"])
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.01, parse_exposition(body)))
        text = self._export(state, 1.0)
        assert 'kvwatch_target_up{target="http://a"} 1.0' in text
        assert "kvwatch_kv_cache_usage_ratio{" in text
        state.record_scrape("http://a", 2.0, ScrapeOutcome(0.5, None, "timeout", "timed out"))
        text = self._export(state, 2.0)
        assert 'kvwatch_target_up{target="http://a"} 0.0' in text
        assert "kvwatch_kv_cache_usage_ratio{" not in text
        assert 'kvwatch_scrape_errors_total{reason="timeout",target="http://a"} 1.0' in text
        assert "kvwatch_preemptions_observed_total{" in text  # counters stay

    def test_log_lines_feed_the_first_target(self, data_dir: Path) -> None:
        state = SidecarState(["http://a", "http://b"])
        state.record_log_lines((data_dir / "vllm-0.32-cpu-server.log").read_text().splitlines())
        view = state.view(0.0)
        log = view.targets[0].log
        assert log.capacity is not None and log.capacity.kv_tokens == 1280
        assert log.events["stats"] > 10
        assert view.targets[1].log.events == {}

    @pytest.mark.parametrize("names", [["vllm:", "vllm_"]])
    def test_both_spellings_give_the_same_signals(self, data_dir: Path, names: list[str]) -> None:
        from kvwatch.sidecar.metrics.exposition import parse_exposition

        body = (data_dir / "vllm-0.32-metrics-busy.txt").read_text()
        sigs = []
        for prefix in names:
            state = SidecarState(["http://a"])
            text = body.replace("vllm:", prefix)
            state.record_scrape("http://a", 1.0, ScrapeOutcome(0.01, parse_exposition(text)))
            sigs.append(state.view(1.0).targets[0].engines)
        assert sigs[0] == sigs[1] and sigs[0][0].signals.capacity_blocks == 40
