"""Detection on the real vLLM fixture: light stays ok, filling is not thrashing, thrashing is."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from loadgen.burst import run_burst
from loadgen.local_server import LocalVLLM
from sidecar.exposition import parse_exposition
from sidecar.vocabulary import KV_USAGE
from tests.loadgen.test_loadgen_live import run as loadgen_run
from tests.receiver import receiver
from tests.sidecar.running import kvwatch_samples, running_sidecar

pytestmark = pytest.mark.integration


class _States:
    """Polls the sidecar's JSON state: (time, state, KV usage, preemptions observed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.rows: list[tuple[float, str, float, float]] = []
        self.errors: list[str] = []
        self.scrape: tuple[int, dict[str, int], str | None] = (0, {}, None)
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                snap = httpx.get(self.url + "/api/state", timeout=5).json()
            except httpx.HTTPError as e:
                self.errors.append(repr(e))
                continue
            target = snap["targets"][0]
            self.scrape = (target["scrapes"], target["scrape_errors"], target["last_error"])
            for e in target["engines"]:
                if e["present"]:
                    sig = e["signals"]
                    self.rows.append(
                        (
                            time.monotonic(),
                            e["state"],
                            sig["kv_usage"] or 0.0,
                            sig["preemptions_observed"],
                        )
                    )
            self._stop.wait(0.1)

    def __enter__(self) -> _States:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()

    def since(self, t: float) -> list[tuple[float, str, float, float]]:
        return [r for r in self.rows if r[0] >= t]


class _VllmPeak:
    """The highest KV usage vLLM's own /metrics shows while the block runs, polled directly."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.peak = 0.0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = httpx.get(self.base + "/metrics", timeout=10).text
            except httpx.HTTPError:
                continue
            for s in parse_exposition(text).family(KV_USAGE):
                self.peak = max(self.peak, s.value)
            self._stop.wait(0.1)

    def __enter__(self) -> _VllmPeak:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()


def test_light_fill_and_thrash_are_told_apart(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    base = vllm_server.base_url
    db = tmp_path / "episodes.db"
    with receiver() as (hook, got):
        args = [
            "--target",
            base,
            "--interval",
            "0.25",
            "--db",
            str(db),
            "--webhook",
            f"{hook},alertmanager",
        ]
        _run_loads(base, args, tmp_path)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not got:
            time.sleep(0.2)
    # the sidecar's own webhook fired for the same load, without Prometheus
    names = [(g["body"]["status"], g["body"]["commonLabels"]["alertname"]) for g in got]
    assert ("firing", "KvwatchThrashing") in names, names
    assert got[0]["body"]["version"] == "4"


def _run_loads(base: str, args: list[str], tmp_path: Path) -> None:
    with running_sidecar(args) as url, _States(url) as states:
        time.sleep(1.5)
        # light: two short streams
        t = time.monotonic()
        asyncio.run(run_burst(base, n=2, max_tokens=100, seed=21))
        time.sleep(1.0)
        light = states.since(t)
        assert light and {r[1] for r in light} == {"ok"}, light

        # fill: pairs of 600-token requests with 540-token prompts: from their prefill on each
        # pair holds 34 to 38 of the 39 usable blocks, six times over; nothing is preempted
        t = time.monotonic()
        with _VllmPeak(base) as vllm_peak:
            records = loadgen_run(
                base,
                tmp_path / "fill",
                "--concurrency",
                "2",
                "--requests",
                "12",
                "--input-len",
                "540",
                "--output-len",
                "60",
            )
        time.sleep(1.0)
        fill = states.since(t)
        kv = [round(r[2], 2) for r in fill]
        assert max(kv) >= 0.85, (
            f"no fill seen by the sidecar: {kv}; vLLM's own peak {vllm_peak.peak:.2f}; "
            f"sidecar scrapes (count, errors, last): {states.scrape}; poll errors: "
            f"{states.errors}; request durations: {[round(r['e2e'], 2) for r in records]}"
        )
        assert fill[-1][3] == fill[0][3], "the fill load preempted; the fixture changed?"
        assert "thrashing" not in {r[1] for r in fill}

        # thrash: 32 x 300 tokens
        t = time.monotonic()
        asyncio.run(run_burst(base, n=32, max_tokens=300, seed=22))
        thrash = states.since(t)
        first_preempt = next(r[0] for r in thrash if r[3] > thrash[0][3])
        first_thrash = next((r[0] for r in thrash if r[1] == "thrashing"), None)
        assert first_thrash is not None, thrash
        assert first_thrash - first_preempt <= 6.0

        # an episode is open; kill the sidecar hard and start it again on the same database
        assert kvwatch_samples(url)["kvwatch_thrashing_episodes_total"][0].value == 1
        url.proc.send_signal(signal.SIGKILL)
        url.proc.wait(10)
    with running_sidecar(args) as url2:
        (ep,) = httpx.get(url2 + "/api/episodes", timeout=5).json()
        assert ep["closed_by"] == "sidecar restart" and ep["preemptions"] >= 3
        assert ep["peak_kv"] >= 0.9 and ep["tokens_recomputed"] > 0
        time.sleep(1.5)
        assert kvwatch_samples(url2)["kvwatch_thrashing_episodes_total"][0].value == 1
