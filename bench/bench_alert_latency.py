"""Time from the first preemption to the alert webhook: the sidecar path and the Prometheus +
Alertmanager path, on the tiny-model vLLM (CPU) driven into thrashing.

The first preemption is when a 100 ms poller first sees vllm:num_preemptions_total rise. Paths:
- sidecar, defaults (1 s scrapes, thrashing entered after its conditions held 2 s);
- sidecar with `--threshold thrashing_enter_after_s=2` (the old default: thrashing held 2 s);
- Prometheus (1 s scrape and evaluation) + Alertmanager (group_wait 1 s) with kvwatch's rules,
  their `for:` scaled by 0.02 (production `for:` adds its full duration: see docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python bench/bench_alert_latency.py
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx

from kvwatch.fleet.alertmanager import running_alertmanager
from kvwatch.local.server import LocalVLLM, ServerConfig
from kvwatch.local.tiny_model import build_tiny_model
from kvwatch.sidecar.contract.vocabulary import PREEMPTIONS
from kvwatch.sidecar.metrics.exposition import parse_exposition
from tests.burst import run_burst
from tests.prometheus import prometheus_alerting
from tests.receiver import receiver
from tests.sidecar.running import running_sidecar


def _preemptions(base: str) -> float:
    exp = parse_exposition(httpx.get(base + "/metrics", timeout=5).text)
    return sum(s.value for s in exp.family(PREEMPTIONS))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    with LocalVLLM(ServerConfig(model=build_tiny_model()), log_path=tmp / "vllm.log") as srv:
        base = srv.base_url
        with (
            receiver() as (h1, got1),
            receiver() as (h2, got2),
            receiver() as (h3, got3),
            running_sidecar(["--target", base, "--db", "", "--webhook", h1]) as s1,
            running_sidecar(
                [
                    "--target",
                    base,
                    "--db",
                    "",
                    "--webhook",
                    h2,
                    "--threshold",
                    "thrashing_enter_after_s=2",
                ]
            ),
            running_alertmanager(h3) as am,
            prometheus_alerting(base, s1, am),
        ):
            before = _preemptions(base)
            first: list[float] = []
            stop = threading.Event()

            def poll() -> None:
                while not stop.is_set() and not first:
                    if _preemptions(base) > before:
                        first.append(time.time())
                    time.sleep(0.1)

            th = threading.Thread(target=poll, daemon=True)
            th.start()
            asyncio.run(run_burst(base, n=32, max_tokens=300, seed=51))
            time.sleep(10)
            stop.set()
            th.join()
    t0 = first[0]

    def when(got: list[dict], name: str, am: bool = False) -> str:
        for g in got:
            alerts = g["body"]["alerts"] if am else [g["body"]]
            for a in alerts:
                label = a["labels"]["alertname"] if am else a["alertname"]
                if a["status"] == "firing" and label == name:
                    return f"{g['t'] - t0:.1f} s"
        return "did not fire"

    print("| path | alert | first preemption to webhook |")
    print("|---|---|---|")
    for name in ("KvwatchKvCacheSaturated", "KvwatchThrashing"):
        print(f"| sidecar, defaults | {name} | {when(got1, name)} |")
        print(f"| sidecar, thrashing held 2 s | {name} | {when(got2, name)} |")
    for name in ("KvwatchThrashing", "VllmPreemptionRateHigh", "VllmKvCacheSaturated"):
        print(f"| Prometheus + Alertmanager, for x0.02 | {name} | {when(got3, name, am=True)} |")


if __name__ == "__main__":
    main()
