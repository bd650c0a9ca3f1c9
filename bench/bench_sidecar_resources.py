"""The sidecar's CPU and memory while it watches a busy real vLLM at 1 s intervals.

Starts the tiny-model vLLM (CPU), a sidecar process scraping it every second and following its
log, and keeps the server busy with waves of 32 concurrent streams for `--seconds`. CPU is the
sidecar's user+system time over the wall time, from /proc. With `--twin MODEL:GPU:KV_BYTES`
the server is the GPU twin at H100 scale instead (time scale 1), held at `--streams` closed-loop
streams of 1,000 + 300 tokens by `kvwatch loadgen run`; the sidecar's own counters then also
say whether its scrapes kept time (scrapes made against the seconds watched, the slowest one).

    .venv/bin/python bench/bench_sidecar_resources.py [--seconds 120]
    PYTHONPATH=. .venv/bin/python bench/bench_sidecar_resources.py \
        --twin llama-3.1-8b:h100:34359738368 --streams 256
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from procfs import cpu_seconds, status_kb
from twins import twin_from_spec

from kvwatch.local.server import LocalVLLM, ServerConfig, free_port
from kvwatch.local.tiny_model import build_tiny_model
from tests.burst import run_burst


async def _load(base: str, until: float) -> int:
    waves = 0
    while time.monotonic() < until:
        await run_burst(base, n=32, max_tokens=300, seed=waves)
        waves += 1
    return waves


@contextmanager
def _server(twin: str | None, log: Path) -> Iterator[str]:
    """The fixture vLLM, or the twin: its base URL."""
    if twin is None:
        with LocalVLLM(ServerConfig(model=build_tiny_model()), log_path=log) as srv:
            yield srv.base_url
        return
    with twin_from_spec(twin, log) as served:
        yield served.base_url


def _closed_loop(base: str, streams: int, seconds: float, tmp: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base, "--run-dir",
         str(tmp / "load"), "--no-progress", "--concurrency", str(streams), "--duration",
         str(seconds), "--input-len", "1000", "--output-len", "300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--twin", metavar="MODEL:GPU:KV_BYTES", help="watch the GPU twin instead")
    ap.add_argument("--streams", type=int, default=256, help="the twin's closed loop (256)")
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    log = tmp / "vllm.log"
    try:
        with _server(ns.twin, log) as base:
            port = free_port()
            cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--target", base, "--log",
                   str(log), "--interval", "1", "--listen", f"127.0.0.1:{port}"]  # fmt: skip
            side = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
            try:
                time.sleep(3)  # start-up (imports) is not steady state
                cpu0, t0 = cpu_seconds(side.pid), time.monotonic()
                rss_max = 0.0
                waves = 0

                own = f"http://127.0.0.1:{port}/metrics"
                scrapes0 = _sample(own, "kvwatch_scrapes_total")
                slowest = 0.0
                loop = None if ns.twin is None else _closed_loop(base, ns.streams, ns.seconds, tmp)

                async def run() -> int:
                    load = None if loop else asyncio.create_task(_load(base, t0 + ns.seconds))
                    nonlocal rss_max, slowest
                    while (load is not None and not load.done()) or (
                        loop is not None and time.monotonic() < t0 + ns.seconds
                    ):
                        rss_max = max(rss_max, status_kb(side.pid, "VmRSS") / 1024)
                        slowest = max(slowest, _sample(own, "kvwatch_scrape_duration_seconds"))
                        await asyncio.sleep(1)
                    return 0 if load is None else await load

                waves = asyncio.run(run())
                watched = time.monotonic() - t0
                cpu = (cpu_seconds(side.pid) - cpu0) / watched
                body = httpx.get(own).text
                scrapes = body.count("kvwatch_")
                made = _sample(own, "kvwatch_scrapes_total") - scrapes0
                running = _sample(f"{base}/metrics", "vllm:num_requests_running")
            finally:
                side.terminate()
                side.wait(10)
                if loop is not None:
                    loop.terminate()
                    loop.wait(30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if ns.twin:
        print(f"load: the twin {ns.twin} held at {ns.streams} streams of 1,000 + 300 tokens for "
              f"{ns.seconds:.0f} s ({running:.0f} running at the end)")  # fmt: skip
        print(f"scrapes: {made:.0f} in {watched:.0f} s at 1 s intervals; slowest {slowest:.3f} s")
    else:
        print(f"load: {waves} waves of 32 x 300-token streams over {ns.seconds:.0f} s")
    print(f"sidecar CPU: {cpu * 100:.2f}% of one core; max RSS: {rss_max:.1f} MB "
          f"({scrapes} kvwatch_ lines exported)")  # fmt: skip


def _sample(url: str, name: str) -> float:
    """The sum of a family's samples on a /metrics page (0 where it has none)."""
    total = 0.0
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rpartition(" ")[2])
    return total


if __name__ == "__main__":
    main()
