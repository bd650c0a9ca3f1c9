"""The sidecar's endpoint under a flood of connections: whether it keeps answering scrapes,
its memory and threads, and how soon it answers once the flood leaves.

Starts a sidecar process (its target is a closed port: only the endpoint matters), opens
`--connections` connections at once that each send half a request and wait (`--mode half`), or
send nothing (`--mode idle`), holds them `--hold` seconds, and meanwhile, from another thread on
fresh connections, probes `/metrics`, `/healthz` and `/api/state` in turn every `--probe-every`
seconds, as Prometheus and a health check would. Then it closes the flood and times the first
`/metrics` answer after that.

    .venv/bin/python bench/bench_endpoint_flood.py [--connections 10000] [--hold 10]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import threading
import time

import httpx
from procfs import status_kb

from kvwatch.local.server import free_port, stop_process, wait_until_ok

_PATHS = ("/metrics", "/healthz", "/api/state")


async def _flood(
    port: int, n: int, hold_s: float, pid: int, mode: str
) -> tuple[int, int, int, float]:
    writers = []
    t0 = time.monotonic()
    opened = 0
    for _ in range(n):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        if mode == "half":
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request
        writers.append(w)
        opened += 1
    opening_s = time.monotonic() - t0
    peak_threads = peak_rss = 0
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        peak_threads = max(peak_threads, status_kb(pid, "Threads"))
        peak_rss = max(peak_rss, status_kb(pid, "VmRSS"))
        await asyncio.sleep(0.1)
    for w in writers:
        w.close()
    return opened, peak_threads, peak_rss, opening_s


def _probe(
    url: str, every_s: float, stop: threading.Event, out: list[tuple[str, float, float | None]]
) -> None:
    """One probe at a time on a fresh connection: its path, when it began (s after the first),
    and how long its answer took (None where none came within 3 s)."""
    start = time.monotonic()
    i = 0
    while not stop.is_set():
        path = _PATHS[i % len(_PATHS)]
        i += 1
        t0 = time.monotonic()
        try:
            ok = httpx.get(url + path, timeout=3).status_code in (200, 503)
            out.append((path, t0 - start, time.monotonic() - t0 if ok else None))
        except httpx.HTTPError:
            out.append((path, t0 - start, None))
        stop.wait(max(0.0, every_s - (time.monotonic() - t0)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--hold", type=float, default=10.0, help="seconds the flood is held")
    p.add_argument("--mode", choices=("half", "idle"), default="half")
    p.add_argument("--probe-every", type=float, default=0.5, help="seconds between probes")
    ns = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, ns.connections + 1000), hard))
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--target", dead,
           "--listen", f"127.0.0.1:{port}", "--db", ""]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    probes: list[tuple[str, float, float | None]] = []
    try:
        if not wait_until_ok(url + "/metrics", proc, 20):
            raise SystemExit("the sidecar did not start")
        idle_rss = status_kb(proc.pid, "VmRSS")
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(url, ns.probe_every, stop, probes))
        prober.start()
        try:
            flood = _flood(port, ns.connections, ns.hold, proc.pid, ns.mode)
            opened, threads, rss, opening_s = asyncio.run(flood)
        finally:
            stop.set()
            prober.join()
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(url + "/metrics", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        back = time.monotonic() - t0
        shed = next(
            (line.split()[1] for line in httpx.get(url + "/metrics", timeout=3).text.splitlines()
             if line.startswith("kvwatch_http_connections_shed_total")), "?",
        )  # fmt: skip
    finally:
        stop_process(proc)
    err = (proc.stderr.read().decode() if proc.stderr else "").count("Traceback")
    print(f"connections opened: {opened} of {ns.connections} ({ns.mode}, held {ns.hold:g} s)")
    print(f"sidecar RSS: idle {idle_rss / 1024:.0f} MB, peak under the flood {rss / 1024:.0f} MB")
    print(f"sidecar threads at peak: {threads}")
    for path in _PATHS:
        times = [t for p_, _, t in probes if p_ == path]
        got = sorted(t for t in times if t is not None)
        worst = f", worst {got[-1] * 1000:.0f} ms" if got else ""
        median = f", median {statistics.median(got) * 1000:.0f} ms" if got else ""
        print(
            f"probes of {path} during the flood: {len(got)} of {len(times)} answered{median}{worst}"
        )
    missed = [f"{at:.1f}" for _, at, t in probes if t is None]
    print(f"the flood took {opening_s:.1f} s to open; probes unanswered at (s): {missed or 'none'}")
    print(f"connections shed or evicted: {shed}")
    print(f"first /metrics answer after the clients left: {back:.2f} s")
    print(f"tracebacks on the sidecar's stderr: {err}")


if __name__ == "__main__":
    main()
