"""Faults and hostile input: the sidecar keeps watching, never exports what cannot be true, and
never shows a target up while its scrapes have stopped (issue 13)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.local.server import free_port
from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.judge.timeline import Timeline
from kvwatch.sidecar.logs.logformats import Malformed, parse_line
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import EngineObservation, observe
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome, scrape_once
from kvwatch.sidecar.outputs.alerting import Alert, AlertTracker, Notification, active_alerts
from kvwatch.sidecar.outputs.exporter import StateCollector, events_refusal
from kvwatch.sidecar.outputs.webhooks import Receiver, deliver_forever, enqueue
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sidecar.store.database import connect
from kvwatch.sidecar.store.firing_store import FiringStore
from kvwatch.sidecar.store.outbox import Outbox
from tests.receiver import receiver
from tests.sidecar.fakes import ENGINE_LABELS as E
from tests.sidecar.fakes import raw_http_server, vllm_body
from tests.sidecar.running import kvwatch_samples, running_sidecar


def _export(state: SidecarState, now: float) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(lambda: state.view(now)))
    return generate_latest(reg).decode()


class TestValuesAreCheckedWhereTheyEnter:
    @pytest.mark.parametrize(
        ("field", "value", "reason"),
        [
            ("kv", "NaN", "not_finite"), ("kv", "+Inf", "not_finite"), ("kv", "-5", "out_of_range"),
            ("kv", "1e300", "out_of_range"), ("kv", "1.44", "out_of_range"),
            ("running", "-1", "out_of_range"), ("pre", "+Inf", "not_finite"),
            ("pre", "-3", "out_of_range"), ("gen", "1e300", "out_of_range"),
        ],
    )  # fmt: skip
    def test_untrue_values_are_rejected_and_counted(
        self, field: str, value: str, reason: str
    ) -> None:
        exp = parse_exposition(vllm_body(**{field: value}))
        assert exp.rejected == {reason: 1} and exp.error_count == 0
        (obs,) = observe(exp).values()
        name = {"kv": "kv_usage", "running": "running", "pre": "preemptions_total",
                "gen": "generation_tokens_total"}[field]  # fmt: skip
        assert getattr(obs, name) is None

    def test_duplicates_are_kept_once_when_equal_and_dropped_when_not(self) -> None:
        twice = vllm_body() + f"vllm:num_requests_running{{{E}}} 2\n"
        exp = parse_exposition(twice)
        (obs,) = observe(exp).values()
        assert obs.running == 2 and exp.rejected == {"duplicate": 1}  # not summed to 4
        clash = vllm_body() + 'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.94\n'
        exp = parse_exposition(clash)
        (obs,) = observe(exp).values()
        assert obs.kv_usage is None and exp.rejected == {"duplicate": 2}  # neither trusted

    def test_one_sample_under_two_spellings_is_no_duplicate(self) -> None:
        # vLLM 0.11 writes its inter-token histogram under the old and the new name at once
        # (seen in tests/data/releases/0.11.0.post2): read once, nothing refused
        twin = (
            f"vllm:inter_token_latency_seconds_count{{{E}}} 95\n"
            f"vllm:time_per_output_token_seconds_count{{{E}}} 95\n"
        )
        exp = parse_exposition(vllm_body() + twin)
        assert not exp.rejected and len(exp.samples["itl_seconds"]) == 1
        # the two spellings disagreeing is no rename: neither is trusted
        clash = twin.replace(" 95\n", " 96\n", 1)
        exp = parse_exposition(vllm_body() + clash)
        assert exp.rejected == {"duplicate": 2} and not exp.samples.get("itl_seconds")

    @pytest.mark.parametrize("blocks", ["NaN", "+Inf", "-40", "0", "1e400"])
    def test_broken_cache_labels_leave_the_capacity_unknown(self, blocks: str) -> None:
        (obs,) = observe(parse_exposition(vllm_body(blocks=blocks))).values()
        assert obs.cache is not None and obs.cache.num_blocks is None
        assert obs.cache.block_size == 32

    def test_an_implausible_counter_jump_reaches_no_rate(self) -> None:
        tl = Timeline()
        base = EngineObservation(preemptions_total=10.0, generation_tokens_total=100.0)
        assert tl.add(0.0, base) is not None
        jump = EngineObservation(preemptions_total=1e12 + 10, generation_tokens_total=200.0)
        after = EngineObservation(preemptions_total=1e12 + 12, generation_tokens_total=300.0)
        assert tl.add(1.0, jump) is None
        assert tl.add(2.0, after) is not None
        assert tl.observed["preemptions_total"] == 2.0  # the jump counted nowhere
        assert tl.rate("preemptions_total", 10, 2.0) == 2.0  # only the plausible step

    def test_hostile_bodies_never_export_nan_inf_or_negative(self) -> None:
        state = SidecarState(["http://a"])
        bodies = [
            vllm_body(), vllm_body(kv="+Inf", pre="NaN"), vllm_body(pre="1e12"),
            vllm_body(kv="-5", running="-3"),
            vllm_body(gen="1e300") + f"vllm:num_requests_running{{{E}}} 7\n", vllm_body(pre="0"),
        ]  # fmt: skip
        for t, body in enumerate(bodies, 1):
            state.record_scrape("http://a", float(t), ScrapeOutcome(0.01, parse_exposition(body)))
            text = _export(state, float(t))
            for line in text.splitlines():
                if line.startswith("#"):
                    continue
                value = float(line.rpartition(" ")[2])
                assert math.isfinite(value) and value >= 0, line
        (t,) = state.view(6.0).targets
        assert t.rejected_samples["not_finite"] == 2 and t.rejected_samples["implausible_jump"] >= 1
        assert 'kvwatch_rejected_samples_total{reason="duplicate",target="http://a"}' in text

    def test_an_itl_histogram_that_cannot_be_true_is_a_counted_refusal(self) -> None:
        """Bucket counts that fall from one bound to the next: no stalls read from it, and the
        scrape says so; a true one after it is read again."""

        def itl(counts: list[int]) -> str:
            bounds = ["0.025", "1.0", "2.5", "+Inf"]
            return "".join(f'vllm:inter_token_latency_seconds_bucket{{{E},le="{le}"}} {n}\n'
                           for le, n in zip(bounds, counts, strict=True))  # fmt: skip

        state = SidecarState(["http://a"])
        bodies = [itl([100, 100, 100, 100]), itl([200, 150, 210, 210]), itl([300, 300, 310, 310]),
                  itl([400, 400, 420, 420])]  # fmt: skip
        for t, hist in enumerate(bodies, 1):
            body = vllm_body(pre=str(t)) + hist
            state.record_scrape("http://a", float(t), ScrapeOutcome(0.01, parse_exposition(body)))
        (t,) = state.view(4.0).targets
        assert t.rejected_samples["broken_histogram"] == 1
        (e,) = t.engines
        assert sum(c.stalls for c in e.stalls.values()) == pytest.approx(10)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e300", "0.5", "7", "1e12"]),
                    min_size=6, max_size=6))  # fmt: skip
    def test_any_mix_of_values_keeps_signals_finite(self, values: list[str]) -> None:
        state = SidecarState(["http://a"])
        keys = ("kv", "running", "waiting", "pre", "gen", "blocks")
        for t in (1.0, 2.0, 3.0):
            body = vllm_body(**dict(zip(keys, values, strict=True)))
            state.record_scrape("http://a", t, ScrapeOutcome(0.01, parse_exposition(body)))
        for tv in state.view(3.0).targets:
            for e in tv.engines:
                for name, v in e.signals.to_dict().items():
                    if isinstance(v, float):
                        assert math.isfinite(v) and v >= 0, (name, v)


class TestOpenMetrics:
    def test_exemplars_parse(self) -> None:
        body = (
            f'vllm:request_num_preemptions_bucket{{{E},le="1.0"}} 16.0 # {{trace_id="a}}b"}} 0.6\n'
            f'vllm:num_preemptions_total{{{E}}} 3 1700000000.1 # {{a="b"}} 1 1700000000\n'
            f'vllm:num_requests_running{{engine="0",model_name="m # x"}} 2\n'
            "# EOF\n"
        )
        exp = parse_exposition(body)
        assert exp.error_count == 0 and exp.rejected == {}
        assert [s.value for s in exp.samples["request_preemptions"]] == [16.0]
        assert exp.samples["preemptions"][0].value == 3.0
        assert exp.samples["running"][0].labels["model_name"] == "m # x"


class TestScrapeDeadline:
    def test_a_trickling_body_times_out_at_the_deadline(self) -> None:
        body = vllm_body().encode()
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        with raw_http_server(reply, trickle_s=0.2) as url:

            async def go() -> ScrapeOutcome:
                async with httpx.AsyncClient() as client:
                    return await scrape_once(client, url + "/metrics", 1.0)

            t0 = time.monotonic()
            out = asyncio.run(go())
        assert out.error_reason == "timeout" and time.monotonic() - t0 < 3


class TestHugeBody:
    def test_a_body_past_the_limit_is_a_scrape_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import kvwatch.sidecar.metrics.scrape as scrape

        monkeypatch.setattr(scrape, "MAX_BODY_BYTES", 10_000)
        huge = vllm_body() * 1000  # about 300 KB
        t = httpx.MockTransport(lambda r: httpx.Response(200, text=huge))

        async def go() -> ScrapeOutcome:
            async with httpx.AsyncClient(transport=t) as client:
                return await scrape_once(client, "http://x/metrics", 5.0)

        out = asyncio.run(go())
        assert out.exposition is None and out.error_reason == "too_large"


class TestNeverUpWhileStopped:
    def test_a_target_without_a_recent_scrape_is_down(self) -> None:
        state = SidecarState(["http://a"], stale_after_s=5.0)
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.01, parse_exposition(vllm_body())))
        assert state.view(5.0).targets[0].up is True
        (t,) = state.view(7.0).targets
        assert t.up is False and "no scrape has ended for 6 s" in str(t.last_error)
        assert not any(e.present for e in t.engines)
        assert "kvwatch_kv_cache_usage_ratio{" not in _export(state, 7.0)

    def test_a_scrape_whose_recording_raises_never_counts_as_ended(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import kvwatch.sidecar.state.sidecar_state as state_module

        state = SidecarState(["http://a"], stale_after_s=5.0)
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.01, parse_exposition(vllm_body())))

        def broken(exp: object) -> None:
            raise ValueError("a bug")

        monkeypatch.setattr(state_module, "observe", broken)
        for t in (3.0, 5.0, 7.0):  # the supervised loop retries, and fails each time
            with pytest.raises(ValueError):
                state.record_scrape(
                    "http://a", t, ScrapeOutcome(0.01, parse_exposition(vllm_body()))
                )
        assert state.view(7.0).targets[0].up is False


class TestLogs:
    @pytest.mark.parametrize(
        "line",
        [
            "Engine 000: Avg prompt throughput: 1..0 tokens/s, Avg generation throughput: 5.0 "
            "tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 10.0%, Prefix cache "
            "hit rate: 0.0%",
            "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 5.0 "
            "tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 140.0%, Prefix cache "
            "hit rate: 0.0%",
            "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 5.0 "
            f"tokens/s, Running: {'9' * 5000} reqs, Waiting: 0 reqs, GPU KV cache usage: 10.0%, "
            "Prefix cache hit rate: 0.0%",
        ],
    )
    def test_broken_or_impossible_numbers_are_skipped_not_raised(self, line: str) -> None:
        assert isinstance(parse_line("INFO 11-29 10:00:00 [loggers.py:123] " + line), Malformed)

    @settings(max_examples=2000, deadline=None)
    @given(st.text(alphabet="0123456789.,-e%: ", max_size=12), st.integers(0, 5))
    def test_a_mutated_stats_line_never_raises(self, junk: str, where: int) -> None:
        parts = ["Avg prompt throughput: ", " tokens/s, Avg generation throughput: ",
                 " tokens/s, Running: ", " reqs, Waiting: ", " reqs, GPU KV cache usage: ",
                 "%, Prefix cache hit rate: "]  # fmt: skip
        values = ["1.0", "5.0", "1", "0", "10.0", "0.0"]
        values[where] = junk
        line = (
            "INFO 11-29 10:00:00 [loggers.py:123] Engine 000: "
            + "".join(p + v for p, v in zip(parts, values, strict=True))
            + "%"
        )
        ev = parse_line(line)
        if ev is not None and not isinstance(ev, Malformed):
            assert 0 <= ev.kv_usage <= 1  # type: ignore[union-attr]

    def test_kvwatch_logs_reports_skipped_lines(self, tmp_path: Path, data_dir: Path) -> None:
        log = tmp_path / "vllm.log"
        good = (data_dir / "vllm-0.32-cpu-server.log").read_text()
        bad = re.sub(r"KV cache usage: [0-9.]+%", "KV cache usage: 1..5%", good, count=3)
        log.write_text(bad)
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", "logs", str(log)], capture_output=True, text=True
        )
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "skipped: 3 lines with broken or impossible numbers" in p.stdout


def _notification(name: str = "KvwatchThrashing") -> Notification:
    a = Alert(name, {"target": "http://a", "severity": "critical"}, {"summary": "s"})
    return Notification("firing", a, time.time())


class TestDelivery:
    def test_a_slow_receiver_never_delays_another(self) -> None:
        with receiver(delay_s=3.0) as (slow_url, slow), receiver() as (fast_url, fast):
            slow_r, fast_r = Receiver(slow_url, name="slow"), Receiver(fast_url, name="fast")
            outbox = Outbox(sqlite3.connect(":memory:", check_same_thread=False))
            for _ in range(3):
                enqueue(outbox, [slow_r, fast_r], [_notification()], "")

            async def go() -> float:
                task = asyncio.create_task(deliver_forever(outbox, [slow_r, fast_r]))
                t0 = time.monotonic()
                while len(fast) < 3 and time.monotonic() - t0 < 20:
                    await asyncio.sleep(0.05)
                took = time.monotonic() - t0
                task.cancel()
                return took

            took = asyncio.run(go())
        assert len(fast) == 3 and took < 2.0, took  # in turn after the slow one: 9 s
        assert len(slow) <= 1


class TestNoSecretInSight:
    @pytest.mark.parametrize(
        "url",
        [
            "https://hooks.slack.com/services/T000/B000/XXXXSECRET",
            "https://pager.example/hook?api_key=SECRET",
            "https://user:SECRET@alerts.example:8443/x",
        ],
    )
    def test_receivers_are_named_without_path_query_or_password(self, url: str) -> None:
        key = Receiver(url).key
        assert "SECRET" not in key and "services" not in key and key.startswith("https://")
        assert Receiver(url).key != Receiver(url + "2").key  # two hooks on one host differ
        assert Receiver(url, name="oncall").key == "oncall"

    def test_the_db_file_is_private(self, tmp_path: Path) -> None:
        path = tmp_path / "state" / "sidecar.db"
        connect(path).close()
        assert path.stat().st_mode & 0o777 == 0o600
        path.chmod(0o644)  # made by an older sidecar
        connect(path).close()
        assert path.stat().st_mode & 0o777 == 0o600


class TestRestartsAreInvisible:
    def _tracker(self, db: Path, started: float) -> AlertTracker:
        return AlertTracker(
            FiringStore(sqlite3.connect(db)), 3600.0, hold_restored_s=30.0, started=started
        )

    def test_one_episode_across_a_restart_is_one_firing_and_one_resolved(
        self, tmp_path: Path
    ) -> None:
        db, a = tmp_path / "s.db", _notification().alert
        notes = self._tracker(db, 0.0).update([a], 1.0)
        after = self._tracker(db, 100.0)  # the engine is not judged thrashing again yet
        notes += after.update([], 101.0) + after.update([], 120.0)
        notes += after.update([a], 125.0)  # judged again: the same alert, still firing
        notes += after.update([], 140.0) + after.update([], 200.0)
        assert [(n.status, n.starts_at) for n in notes] == [("firing", 1.0), ("resolved", 1.0)]

    def test_target_down_keeps_when_it_started(self, tmp_path: Path) -> None:
        db, th = tmp_path / "s.db", Thresholds()
        state = SidecarState(["http://a"], th, wall_clock=lambda: 1000.0)
        state.record_scrape("http://a", 1.0, ScrapeOutcome(0.5, None, "connect", "refused"))
        first = active_alerts(state.view(1.0), th, 1200.0)
        notes = self._tracker(db, 1000.0).update(first.active, 1200.0, first.holding)
        # restarted at 1300: down, but not yet for 2 minutes as this process counts
        state2 = SidecarState(["http://a"], th, wall_clock=lambda: 1300.0)
        state2.record_scrape("http://a", 1.0, ScrapeOutcome(0.5, None, "connect", "refused"))
        again = active_alerts(state2.view(1.0), th, 1400.0)
        assert again.active == [] and again.holding
        after = self._tracker(db, 1300.0)
        notes += after.update(again.active, 1400.0, again.holding)
        assert [(n.status, n.starts_at) for n in notes] == [("firing", 1200.0)]
        assert after.firing_now()[0].starts_at == 1200.0


class TestATimedOutScrapeIsNoRecovery:
    """vLLM's API server answers /metrics late when it is busiest (seconds, on the CPU server
    under a burst): a scrape that times out then must neither resolve the engine's page nor,
    at the next good scrape, send it again."""

    def _run(self, outcomes: list[str | None]) -> list[tuple[float, str, str]]:
        clock = [1000.0]
        th = Thresholds()
        state = SidecarState(["http://a"], th, wall_clock=lambda: clock[0])
        tracker = AlertTracker(FiringStore(connect(None)), th.repeat_interval_s)
        notes: list[tuple[float, str, str]] = []
        for i, body in enumerate(outcomes):
            clock[0] = 1000.0 + i
            out = (
                ScrapeOutcome(2.0, None, "timeout", "timed out")
                if body is None
                else ScrapeOutcome(0.01, parse_exposition(body))
            )
            state.record_scrape("http://a", float(i), out)
            got = active_alerts(state.view(float(i)), th, clock[0])
            for n in tracker.update(got.active, clock[0], got.holding):
                notes.append((clock[0] - 1000.0, n.status, n.alert.name))
        return notes

    def test_the_page_holds_through_timeouts(self) -> None:
        full = vllm_body(kv=1.0, waiting=3)
        notes = self._run([full] * 5 + [None, None, full, None] + [full] * 3)
        assert notes == [(2.0, "firing", "KvwatchKvCacheSaturated")]

    def test_target_down_takes_over_once_it_fires(self) -> None:
        full = vllm_body(kv=1.0, waiting=3)
        down_for = int(Thresholds().target_down_after_s)
        notes = self._run([full] * 5 + [None] * (down_for + 2))
        # the last good scrape was at 4 s: down for 120 s at 124 s
        assert notes == [
            (2.0, "firing", "KvwatchKvCacheSaturated"),
            (124.0, "firing", "KvwatchTargetDown"),
            (124.0, "resolved", "KvwatchKvCacheSaturated"),
        ]


@pytest.mark.integration
def test_a_slow_disk_never_holds_up_the_scrapes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SQLite at a shared disk's worst (each alert write takes a second, as fsyncs on CI's did):
    the scrapes keep their interval, and the alert still goes out. When the writes ran on the
    event loop, the sidecar made 16 scrapes in 16 s at a 0.25 s interval and said it was up."""
    from kvwatch.sidecar.daemon import SidecarConfig, _main
    from kvwatch.sidecar.outputs.webhooks import load_receivers
    from kvwatch.sidecar.store.episode_store import EpisodeStore

    def slowly(f):  # type: ignore[no-untyped-def]
        def wrapped(*a, **k):  # type: ignore[no-untyped-def]
            time.sleep(1.0)
            return f(*a, **k)

        return wrapped

    monkeypatch.setattr(AlertTracker, "update", slowly(AlertTracker.update))
    monkeypatch.setattr(Outbox, "put", slowly(Outbox.put))
    body = vllm_body(kv=1.0, waiting=3)  # full with a queue: KvwatchKvCacheSaturated fires
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body.encode()
    with raw_http_server(reply) as target, receiver() as (hook, got):
        cfg = SidecarConfig(
            (target,), interval_s=0.1, db_path=tmp_path / "s.db",
            receivers=tuple(load_receivers([hook], None)),
        )  # fmt: skip
        state = SidecarState([target], cfg.thresholds, EpisodeStore(cfg.db_path))

        async def watch_for(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_main(cfg, state, None), seconds)

        asyncio.run(watch_for(6.0))
        scrapes = state.view().targets[0].scrapes
        assert scrapes >= 30, f"{scrapes} scrapes in 6 s at 0.1 s"  # 60 when on time
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.1)
    assert [g["body"]["alertname"] for g in got] == ["KvwatchKvCacheSaturated"]


class TestEventsEndpoint:
    def test_refusals(self) -> None:
        assert events_refusal(None, True, None) is None
        assert events_refusal(None, False, None) == (
            403, "events from beyond loopback need KVWATCH_EVENTS_TOKEN set on the sidecar"
        )  # fmt: skip
        assert events_refusal("t0k", True, "Bearer t0k") is None
        assert events_refusal("t0k", False, "Bearer t0k") is None
        assert events_refusal("t0k", True, "Bearer nope")[0] == 401  # type: ignore[index]
        assert events_refusal("t0k", True, None)[0] == 401  # type: ignore[index]

    @pytest.mark.parametrize(
        "event",
        [[1, 2], "stage_start", {"event": "stage_start", "stage": "a", "unix": float("nan")},
         {"event": "stage_start", "stage": "a", "unix": True}, {"event": "begin", "stage": "a"}],
    )  # fmt: skip
    def test_bad_events_are_refused(self, event: object) -> None:
        with pytest.raises(ValueError):
            SidecarState(["http://a"]).record_load_event(event)

    def test_open_stages_are_capped(self) -> None:
        state = SidecarState(["http://a"])
        for i in range(100):
            state.record_load_event({"event": "stage_start", "stage": f"s{i}"})
        with pytest.raises(ValueError, match="stages open"):
            state.record_load_event({"event": "stage_start", "stage": "one more"})
        state.record_load_event({"event": "stage_end", "stage": "s0"})
        state.record_load_event({"event": "stage_start", "stage": "one more"})

    @pytest.mark.integration
    def test_the_live_endpoint_answers_400_401_and_stays_valid_json(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("KVWATCH_EVENTS_TOKEN", "t0k")
        with running_sidecar(["--target", f"http://127.0.0.1:{free_port()}", "--db", ""]) as side:
            post = functools.partial(httpx.post, side + "/api/events", timeout=5)
            ok = {"Authorization": "Bearer t0k"}
            assert post(json={"event": "stage_start", "stage": "a"}).status_code == 401
            assert post(json={"event": "stage_start", "stage": "a"}, headers=ok).status_code == 204
            for body in (b"[1]", b'"x"', b"[" * 100_000, b'{"event": "stage_end", "stage": '
                         b'"a", "unix": NaN}', b"{not json"):  # fmt: skip
                r = post(content=body, headers=ok)
                assert r.status_code == (413 if len(body) > 65536 else 400), (body[:40], r.text)
            doc = json.loads(httpx.get(side + "/api/state", timeout=5).text, parse_constant=_no)
            assert list(doc["load"]["stages"]) == ["a"]


def _no(name: str) -> None:
    raise AssertionError(f"/api/state holds {name}, which is not JSON")


@pytest.mark.integration
def test_a_flood_of_held_connections_neither_costs_a_thread_each_nor_starves_a_scrape() -> None:
    """1,000 half-sent requests held open (bench/bench_endpoint_flood.py runs 10,000): scrapes
    on fresh connections are answered meanwhile, and the sidecar's threads stay few."""
    with running_sidecar(["--target", f"http://127.0.0.1:{free_port()}", "--db", ""]) as side:
        host, port = side.removeprefix("http://").split(":")

        async def flood() -> tuple[int, list[int]]:
            writers = []
            for _ in range(1000):
                _, w = await asyncio.open_connection(host, int(port))
                w.write(b"GET /metrics HTTP/1.1\r\n")
                writers.append(w)
            async with httpx.AsyncClient(timeout=3) as client:
                codes = []
                for path in ("/metrics", "/healthz", "/api/state"):
                    r = await client.get(side + path, headers={"Connection": "close"})
                    codes.append(r.status_code)
            threads = int(
                next(
                    line.split()[1]
                    for line in Path(f"/proc/{side.proc.pid}/status").read_text().splitlines()
                    if line.startswith("Threads:")
                )
            )
            for w in writers:
                w.close()
            return threads, codes

        threads, codes = asyncio.run(flood())
        assert threads < 20
        assert codes[0] == 200 and codes[1] in (200, 503) and codes[2] == 200
        r = httpx.get(side + "/metrics", timeout=5)
        assert r.status_code == 200 and "kvwatch_target_up" in r.text
        (shed,) = kvwatch_samples(side)["kvwatch_http_connections_shed_total"]
        assert shed.value >= 1000 - 512  # the oldest still sending were evicted


def test_kvwatch_logs_keeps_engines_apart() -> None:
    from kvwatch.sidecar.logs.logformats import parse_text
    from kvwatch.sidecar.logs.logsummary import summarize

    line = (
        "INFO 11-29 10:00:01 [loggers.py:1] Engine {e}: Avg prompt throughput: 0.0 tokens/s, Avg "
        "generation throughput: 100.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache "
        "usage: {kv}%, Prefix cache hit rate: 0.0%\n"
    )
    text = line.format(e="000", kv="10.0") + line.format(e="001", kv="30.0")
    rows = summarize(list(parse_text(text))).to_dict()["minutes"]
    assert [(r["engine"], r["generation_tps_mean"], r["kv_usage_max"]) for r in rows] == [
        ("000", 100.0, 0.1), ("001", 100.0, 0.3),
    ]  # fmt: skip


def test_a_firing_alertmanager_payload_says_until_when_it_holds(tmp_path: Path) -> None:
    """If the sidecar is gone for good, Alertmanager resolves the alert on its own at endsAt."""
    from kvwatch.sidecar.outputs.webhooks import render

    tracker = AlertTracker(
        FiringStore(sqlite3.connect(tmp_path / "s.db")), repeat_interval_s=3600.0
    )
    (n,) = tracker.update([_notification().alert], 1_700_000_000.0)
    assert n.valid_until == 1_700_000_000.0 + 7200
    (a,) = render(n, "alertmanager", "id", "")["alerts"]
    assert a["endsAt"].startswith("2023-11-15T00:13:20")  # two repeat intervals on
    (r,) = tracker.update([], 1_700_000_100.0)
    assert render(r, "alertmanager", "id", "")["alerts"][0]["endsAt"].startswith(
        "2023-11-14T22:15:00"
    )


@pytest.mark.integration
def test_a_hostile_target_leaves_the_sidecar_watching() -> None:
    """A FAKE target (a real vLLM cannot be made to lie): NaN cache labels, an infinite KV
    usage, a duplicated series. The sidecar scrapes on, says the target is up, exports only true
    figures and counts what it refused; no loop fails."""
    body = vllm_body(kv="+Inf", blocks="NaN") + f"vllm:num_requests_running{{{E}}} 2\n"
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body.encode()
    with (
        raw_http_server(reply) as target,
        running_sidecar(["--target", target, "--db", "", "--interval", "0.3"]) as side,
    ):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = httpx.get(side + "/metrics", timeout=5).text
            if re.search(r"kvwatch_scrapes_total\S* [3-9]", text):
                break
            time.sleep(0.3)
        assert re.search(r'kvwatch_target_up\{target="[^"]+"\} 1\.0', text), text
        assert 'reason="not_finite"' in text and 'reason="duplicate"' in text
        assert "kvwatch_kv_cache_usage_ratio{" not in text  # refused, so unknown
        assert re.search(r"kvwatch_requests_running\{.*\} 2\.0", text)
        health = httpx.get(side + "/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["failing_loops"] == []


@pytest.mark.integration
def test_answers_that_come_late_by_turns_do_not_inflate_rates() -> None:
    """A FAKE target (no real server counts at an exact rate on demand): its token counter
    grows 400 a second, read when a request arrives, and every other answer leaves 1.5 s late,
    as from a server (or a sidecar) starved of CPU. Stamped when each answer came, two scrapes'
    counting fell into a moment and the rate shot up (5,402 tokens/s, 13x, was seen across a
    vLLM restart in CI); stamped when each scrape began, as Prometheus does, it stays true."""
    from http.server import BaseHTTPRequestHandler

    from tests.http_server import serving

    t0 = time.monotonic()
    turn = [0]

    class Late(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = vllm_body(gen=round(400 * (time.monotonic() - t0)), kv=0.2).encode()
            turn[0] += 1
            if self.path.startswith("/metrics") and turn[0] % 2:
                time.sleep(1.5)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    rates: list[float] = []
    with (
        serving(Late) as target,
        running_sidecar(
            ["--target", target, "--db", "", "--interval", "0.5", "--short-window", "3"]
        ) as side,  # fmt: skip
    ):
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            rates += [
                x.value
                for x in kvwatch_samples(side).get("kvwatch_generation_tokens_per_second", [])
            ]
            time.sleep(0.2)
    assert len(rates) >= 10, rates
    assert max(rates) < 400 * 1.3 and min(rates) > 400 / 1.3, rates
