"""What routing costs the replicas' prefix caches, predicted from their KV events and measured by
switching the router (issue #45, part 3).

Two twins (Llama 3.1 8B on a simulated H100, time scale 1, `--kv-blocks` each) publish their KV
events on Unix sockets; vLLM's own router (`vllm-router`) sits in front. One sidecar follows both
replicas' events (`--target A --kv-events A --target B --kv-events B`). Multi-turn
conversations (`kvwatch loadgen run --sessions` through the router) run twice:

1. round robin: a conversation's turns land on either replica, so both cache its context. The
   sidecar says the fleet's duplicated share, the replicas' hit rate as routed, and the pooled
   hit rate: one cache of both replicas' memory, which a prefix-aware router comes near;
2. cache_aware (vllm-router's prefix-tree policy), with another seed (new conversations), and a
   fresh sidecar: the hit rate vLLM's counters measure on the replicas is held to the pooled
   figure predicted in run 1.

    PYTHONPATH=. .venv/bin/python bench/bench_fleet_prefix.py [--kv-blocks 4000] \
        [--sessions 24] [--seconds 150] [--save bench/results/twin/fleet-prefix.json]
Results: docs/detection.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from kvwatch.fleet.router import Router
from kvwatch.local.server import free_port, stop_process, wait_until_ok
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.observe import observe, prefix_cache_counts
from kvwatch.sizing.kvmath import kv_bytes_per_token, resolve_model
from kvwatch.twin.serve import start_twin

MODEL, GPU, BLOCK = "llama-3.1-8b", "h100", 16
SESSION_ARGS = ["--turns", "8", "--think-time", "uniform:5,15", "--input-len", "1500",
                "--turn-input-len", "150", "--output-len", "150"]  # fmt: skip


def _counters(url: str) -> tuple[float, float]:
    """vLLM's own prefix-cache counters (queries, hits), in tokens."""
    body = httpx.get(url + "/metrics", timeout=30).text
    return prefix_cache_counts(observe(parse_exposition(body)))


def _sidecar(stack: ExitStack, replicas: list[tuple[str, Path]]) -> str:
    port = free_port()
    cmd = [sys.executable, "-m", "kvwatch", "sidecar", "--db", "", "--listen",
           f"127.0.0.1:{port}"]  # fmt: skip
    for url, _ in replicas:
        cmd += ["--target", url]
    for _, where in replicas:
        cmd += ["--kv-events", f"ipc://{where}/kv-events.sock"]
    for _, where in replicas:
        cmd += ["--kv-events-replay", f"ipc://{where}/kv-replay.sock"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(stop_process, proc)
    base = f"http://127.0.0.1:{port}"
    if not wait_until_ok(base + "/healthz", proc, 30.0):
        raise SystemExit("the sidecar did not start")
    return base


def _phase(router: str, replicas: list[tuple[str, Path]], ns: argparse.Namespace, seed: int,
           work: Path) -> dict[str, Any]:  # fmt: skip
    with ExitStack() as stack:
        side = _sidecar(stack, replicas)
        before = [_counters(url) for url, _ in replicas]
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", router, "--sessions",
             "--concurrency", str(ns.sessions), "--duration", f"{ns.seconds:g}", *SESSION_ARGS,
             "--json", "--no-progress", "--run-dir", str(work), "--seed", str(seed),
             "--server-metrics", "none"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if p.returncode not in (0, 1):
            raise SystemExit(f"loadgen failed ({p.returncode}): {p.stderr[-2000:]}")
        time.sleep(3.0)  # the last batches and a scrape
        after = [_counters(url) for url, _ in replicas]
        state = httpx.get(side + "/api/state", timeout=30).json()
    q = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    h = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    per = [(a[1] - b[1]) / max(a[0] - b[0], 1) for a, b in zip(after, before, strict=True)]
    fleet = state.get("fleet_prefix") or {}
    return {"measured_hit_rate": h / max(q, 1), "measured_by_replica": per,
            "prompt_tokens": q, "fleet_prefix": fleet,
            "curves": [t["prefix_curve"] for t in state["targets"]]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kv-blocks", type=int, default=4000, help="per replica (4000)")
    ap.add_argument("--sessions", type=int, default=24, help="live conversations (24)")
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--save", type=Path)
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-fleet-prefix-"))
    per_block = round(kv_bytes_per_token(resolve_model(MODEL)) * BLOCK)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "kv_blocks": ns.kv_blocks,
                           "sessions": ns.sessions, "seconds": ns.seconds,
                           "twin": f"{MODEL} on a simulated {GPU}, time scale 1"}  # fmt: skip
    with ExitStack() as stack:
        replicas = []
        for i in range(2):
            where = tmp / f"replica-{i}"
            where.mkdir()
            config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                 "endpoint": f"ipc://{where}/kv-events.sock",
                                 "replay_endpoint": f"ipc://{where}/kv-replay.sock"})  # fmt: skip
            twin = stack.enter_context(start_twin(
                MODEL, GPU, where / "vllm.log", time_scale=1.0, seed=i, status_dir=where,
                vllm_args=("--max-model-len", "8192", "--block-size", str(BLOCK),
                           "--kv-cache-memory-bytes", str(ns.kv_blocks * per_block),
                           "--kv-events-config", config),
            ))  # fmt: skip
            replicas.append((twin.base_url, where))
        router = Router([u for u, _ in replicas], "round_robin", tmp / "router.log")
        router.start()
        stack.callback(router.stop)
        print("round robin ...", flush=True)
        out["round_robin"] = _phase(router.url, replicas, ns, 1, tmp / "rr")
        router.restart("cache_aware")
        print("cache_aware ...", flush=True)
        out["cache_aware"] = _phase(router.url, replicas, ns, 2, tmp / "ca")
    rr, ca = out["round_robin"], out["cache_aware"]
    predicted = (rr["fleet_prefix"] or {}).get("pooled_hit_ratio")
    out["predicted_cache_aware"] = predicted
    out["points_off"] = None if predicted is None else round(
        100 * (predicted - ca["measured_hit_rate"]), 2)  # fmt: skip
    for name in ("round_robin", "cache_aware"):
        f = out[name]["fleet_prefix"] or {}
        print(f"{name}: vLLM {out[name]['measured_hit_rate']:.4f} "
              f"(by replica {[round(x, 4) for x in out[name]['measured_by_replica']]}); sidecar: "
              f"replicas {f.get('replicas_hit_ratio')}, pooled {f.get('pooled_hit_ratio')}, "
              f"duplicated {f.get('duplicated_share')}")  # fmt: skip
    print(f"predicted for cache_aware {predicted}, measured {ca['measured_hit_rate']:.4f} "
          f"({out['points_off']} points)")  # fmt: skip
    if ns.save:
        ns.save.parent.mkdir(parents=True, exist_ok=True)
        ns.save.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
