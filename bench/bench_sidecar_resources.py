"""The sidecar's CPU and memory while it watches a busy real vLLM at 1 s intervals.

Starts the tiny-model vLLM (CPU), a sidecar process scraping it every second and following its
log, and keeps the server busy with waves of 32 concurrent streams for `--seconds`. CPU is the
sidecar's user+system time over the wall time, from /proc.

    .venv/bin/python bench/bench_sidecar_resources.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from procfs import cpu_seconds, status_kb

from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig, free_port
from kvwatch.loadgen.tiny_model import build_tiny_model
from tests.burst import run_burst


async def _load(base: str, until: float) -> int:
    waves = 0
    while time.monotonic() < until:
        await run_burst(base, n=32, max_tokens=300, seed=waves)
        waves += 1
    return waves


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120.0)
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    log = tmp / "vllm.log"
    with LocalVLLM(ServerConfig(model=build_tiny_model()), log_path=log) as srv:
        port = free_port()
        cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--target", srv.base_url,
               "--log", str(log), "--interval", "1", "--listen", f"127.0.0.1:{port}"]  # fmt: skip
        side = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)  # start-up (imports) is not steady state
            cpu0, t0 = cpu_seconds(side.pid), time.monotonic()
            rss_max = 0.0
            waves = 0

            async def run() -> int:
                task = asyncio.create_task(_load(srv.base_url, t0 + ns.seconds))
                nonlocal rss_max
                while not task.done():
                    rss_max = max(rss_max, status_kb(side.pid, "VmRSS") / 1024)
                    await asyncio.sleep(1)
                return await task

            waves = asyncio.run(run())
            cpu = (cpu_seconds(side.pid) - cpu0) / (time.monotonic() - t0)
            scrapes = httpx.get(f"http://127.0.0.1:{port}/metrics").text.count("kvwatch_")
        finally:
            side.terminate()
            side.wait(10)
    print(f"load: {waves} waves of 32 x 300-token streams over {ns.seconds:.0f} s")
    print(f"sidecar CPU: {cpu * 100:.2f}% of one core; max RSS: {rss_max:.1f} MB "
          f"({scrapes} kvwatch_ lines exported)")  # fmt: skip


if __name__ == "__main__":
    main()
