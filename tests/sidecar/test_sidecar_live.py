"""The sidecar against the real vLLM fixture, under a preempting load and across a restart."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kvwatch.local.server import LocalVLLM, ServerConfig, free_port
from tests.burst import THRASH_N, THRASH_TOKENS, run_burst
from tests.sidecar.running import Sidecar, kvwatch_samples, running_sidecar

pytestmark = pytest.mark.integration


def _value(samples: dict, name: str) -> float | None:
    got = samples.get(name)
    return got[0].value if got else None


class _Watcher:
    """Polls the sidecar in a thread and keeps every reading; a poll it did not answer (or
    answered with what does not parse) is kept too, with its threads' stacks at the first
    unanswered one, and polling goes on."""

    def __init__(self, url: Sidecar, period: float = 0.5) -> None:
        self.url, self.period = url, period
        self.readings: list[dict] = []
        self.times: list[float] = []  # monotonic, when each reading came
        self.errors: list[str] = []
        self.stacks = ""
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.readings.append(kvwatch_samples(self.url))
                self.times.append(time.monotonic())
            except Exception as e:  # a poll unanswered or unreadable: said, and polling goes on
                self.errors.append(f"{time.monotonic():.1f}: {e!r}")
                if isinstance(e, httpx.HTTPError):
                    self.stacks = self.stacks or self.url.stacks()
            self._stop.wait(self.period)

    def seen(self, since: float) -> str:
        """For an assertion's message; times from `since` (monotonic)."""
        at = ", ".join(f"{t - since:.1f}" for t in self.times[:40])
        return (
            f"{len(self.readings)} readings at {at} s; polls not answered: {self.errors}; the "
            f"sidecar's threads at the first: {self.stacks}"
        )

    def longest_gap(self, since: float) -> float:
        """The longest time from `since` to now without a reading."""
        at = [since, *(t for t in self.times if t > since), time.monotonic()]
        return max(b - a for a, b in zip(at, at[1:], strict=False))

    def __enter__(self) -> _Watcher:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()

    def series(self, name: str) -> list[float]:
        return [v for r in self.readings if (v := _value(r, name)) is not None]


def test_preempting_load_then_quiet(
    vllm_server: LocalVLLM, live_retry: Callable[[str], None]
) -> None:
    args = [
        "--target",
        vllm_server.base_url,
        "--log",
        str(vllm_server.log_path),
        "--log-from-start",
        "--interval",
        "0.5",
        "--short-window",
        "3",
    ]
    with running_sidecar(args) as url, _Watcher(url) as w:
        # a second burst only when the polls left a gap as long as the short window: on these
        # machines a process can stall for seconds (docs/testing.md), and a stalled poller can
        # miss the whole window a preemption is in
        for attempt in range(2):
            t0 = time.monotonic()
            records = asyncio.run(
                run_burst(
                    vllm_server.base_url, n=THRASH_N, max_tokens=THRASH_TOKENS, seed=2 + attempt
                )
            )
            took = time.monotonic() - t0
            assert all(r.ok for r in records), [r.error for r in records if not r.ok]
            assert all(r.output_tokens == THRASH_TOKENS for r in records), [
                r.output_tokens for r in records
            ]
            rate = w.series("kvwatch_preemptions_per_second_short")
            if max(rate, default=0) > 0 or w.longest_gap(t0) < 3.0:
                break
            live_retry(f"the polls left a {w.longest_gap(t0):.1f} s gap in the burst")
        usage = w.series("kvwatch_kv_cache_usage_ratio")
        assert max(rate, default=0) > 0, (
            f"sidecar saw no preemption in a {took:.1f} s burst; {w.seen(t0)}"
        )
        # twice a second, a gauge's poll misses most full moments: a preemption frees blocks
        assert max(usage) >= 0.75, usage
        # after the load: rates fall to zero within the short window (plus a scrape or two)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            s = kvwatch_samples(url)
            if (
                _value(s, "kvwatch_preemptions_per_second_short") == 0
                and _value(s, "kvwatch_generation_tokens_per_second") == 0
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"rates did not return to zero: {s}")
        assert _value(s, "kvwatch_kv_cache_usage_ratio") == 0
        assert _value(s, "kvwatch_preemptions_observed_total") >= 1
        # the victims' waits, read from the ITL histogram in the windows the counter rose
        stalled = {x.labels["cause"]: x.value for x in s["kvwatch_stall_seconds_observed_total"]}
        assert stalled.get("preemption", 0.0) > 1.0, stalled
        assert _value(s, "kvwatch_log_lines_total") > 50
        assert _value(s, "kvwatch_kv_cache_capacity_blocks") == 40


def test_restart_under_the_sidecar(tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    cfg = ServerConfig(model=tiny_model, port=port)
    base = f"http://127.0.0.1:{port}"
    args = ["--target", base, "--interval", "0.5", "--short-window", "3"]
    with running_sidecar(args) as url, _Watcher(url, period=0.3) as w:
        with LocalVLLM(cfg, log_path=tmp_path / "a.log"):
            asyncio.run(run_burst(base, n=24, max_tokens=100, seed=3))
            time.sleep(1.5)
        # stopped: the sidecar says down, and drops the engine series instead of showing zeros
        time.sleep(2)
        down = kvwatch_samples(url)
        assert _value(down, "kvwatch_target_up") == 0
        assert "kvwatch_kv_cache_usage_ratio" not in down
        with LocalVLLM(cfg, log_path=tmp_path / "b.log"):
            asyncio.run(run_burst(base, n=4, max_tokens=64, seed=4))
            time.sleep(2)
            after = kvwatch_samples(url)
    assert _value(after, "kvwatch_target_up") == 1
    assert _value(after, "kvwatch_counter_resets_total") >= 1
    for name in (
        "kvwatch_preemptions_per_second_short",
        "kvwatch_preemptions_per_second_long",
        "kvwatch_generation_tokens_per_second",
    ):
        values = w.series(name)
        assert values and min(values) >= 0, name
    # 100 tokens x 24 requests cannot make more than a few thousand tokens/s here
    assert max(w.series("kvwatch_generation_tokens_per_second")) < 5000
    observed = w.series("kvwatch_preemptions_observed_total")
    assert observed == sorted(observed), "observed preemptions went backwards"


def test_command_mode_passes_output_through_and_exits_with_its_code(tmp_path: Path) -> None:
    import subprocess

    from tests.sidecar.logs.test_logformats import CAP_CPU, V1_DEFERRED

    script = tmp_path / "fake_vllm.py"
    script.write_text(
        "import sys, time\n"
        f"print({CAP_CPU!r}, flush=True)\n"
        f"print({V1_DEFERRED!r}, file=sys.stderr, flush=True)\n"
        "time.sleep(2)\nsys.exit(3)\n"
    )
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvwatch",
            "sidecar",
            "--target",
            "http://127.0.0.1:9",
            "--listen",
            f"127.0.0.1:{port}",
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert CAP_CPU.encode() in proc.stdout and V1_DEFERRED.encode() in proc.stdout
    assert b"Traceback" not in proc.stderr


def test_load_stages_reach_the_sidecar(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    import httpx

    from tests.loadgen.test_loadgen_live import run as loadgen_run

    with running_sidecar(["--target", vllm_server.base_url, "--db", ""]) as side:
        loadgen_run(
            vllm_server.base_url,
            tmp_path,
            "--stage",
            "constant:rate=4@1s",
            "--stage",
            "concurrency:n=2#2",
            "--output-len",
            "8",
            "--sidecar",
            side,
        )
        load = httpx.get(side + "/api/state").json()["load"]
        bad = httpx.post(side + "/api/events", json={"event": "lunch"})
    assert [(e["event"], e["stage"]) for e in load["events"]] == [
        ("stage_start", "constant:rate=4@1s"),
        ("stage_end", "constant:rate=4@1s"),
        ("stage_start", "concurrency:n=2#2"),
        ("stage_end", "concurrency:n=2#2"),
    ]
    assert load["stages"] == {}
    assert bad.status_code == 400 and b"stage_start" in bad.content
