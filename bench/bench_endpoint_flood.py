"""The sidecar's endpoint under a flood of connections: memory, threads, and how soon it
answers again.

Starts a sidecar process (its target is a closed port: only the endpoint matters), opens
`--connections` connections at once that each send half a request and wait, holds them
`--hold` seconds, closes them, and times the first `/healthz` answer after that.

    .venv/bin/python bench/bench_endpoint_flood.py [--connections 10000] [--hold 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time

import httpx
from procfs import status_kb

from kvwatch.loadgen.local_server import free_port, stop_process, wait_until_ok


async def _flood(port: int, n: int, hold_s: float, pid: int) -> tuple[int, int, int]:
    writers = []
    opened = 0
    for _ in range(n):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request
        writers.append(w)
        opened += 1
    peak_threads = peak_rss = 0
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        peak_threads = max(peak_threads, status_kb(pid, "Threads"))
        peak_rss = max(peak_rss, status_kb(pid, "VmRSS"))
        await asyncio.sleep(0.1)
    for w in writers:
        w.close()
    return opened, peak_threads, peak_rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--hold", type=float, default=3.0)
    ns = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, ns.connections + 1000), hard))
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--target", dead,
           "--listen", f"127.0.0.1:{port}", "--db", ""]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_ok(url + "/metrics", proc, 20):
            raise SystemExit("the sidecar did not start")
        idle_rss = status_kb(proc.pid, "VmRSS")
        opened, threads, rss = asyncio.run(_flood(port, ns.connections, ns.hold, proc.pid))
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(url + "/metrics", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        back = time.monotonic() - t0
    finally:
        stop_process(proc)
    err = (proc.stderr.read().decode() if proc.stderr else "").count("Traceback")
    print(f"connections opened: {opened} of {ns.connections}")
    print(f"sidecar RSS: idle {idle_rss / 1024:.0f} MB, peak under the flood {rss / 1024:.0f} MB")
    print(f"sidecar threads at peak: {threads}")
    print(f"first /metrics answer after the clients left: {back:.2f} s")
    print(f"tracebacks on the sidecar's stderr: {err}")


if __name__ == "__main__":
    main()
