"""The fleet proofs, on twins behind vllm-router (kvwatch/fleet/lab.py), results in docs/fleet.md.

- `imbalance`: round-robin routing of a session workload that piles the long conversations on
  one replica (tests/fleet/workloads.py): the fleet rules judge imbalance and name the
  replica, the fleet page is not sent; the same trace again with the router on cache_aware,
  as the alert advises, evens it out.
- `shortage`: a load the whole fleet cannot hold: the fleet page fires once (one notification
  group on the paging route), `kvwatch:fleet_replicas_needed` says how many replicas; that many
  more twins are started and registered with the router, and the same load runs again.
- `kill`: a replica's server killed mid-run: its sidecar and the fleet rules report it down
  with the capacity lost, and no imbalance is judged.

The twins are Llama 3.1 8B on a simulated H100 (time scale 1) with a small KV cache each
(--kv-blocks), so that two cores can drive a fleet of them to the limit.

    PYTHONPATH=. .venv/bin/python bench/bench_fleet.py imbalance \
        [--save bench/results/twin/fleet-imbalance.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvwatch.advise.fleet_source import fleets_from_prometheus
from kvwatch.fleet.lab import Fleet, FleetSpec
from kvwatch.fleet.prometheus import wait_for_series
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS
from kvwatch.sizing.fleet import advise_fleet
from tests.fleet.figures import fleet_figures
from tests.fleet.workloads import PileSpec, session_pile_trace

FOR_SCALE = 1 / 30  # the rules' `for: 5m` is 10 s here: the judgements, not the waiting


def _notes(fleet: Fleet, since: float) -> list[dict[str, Any]]:
    return [
        {
            "t": round(n.at - since, 1),
            "path": n.path,
            "status": n.status,
            "group": n.group_labels,
            "alerts": sorted(n.names),
        }  # fmt: skip
        for n in fleet.receiver.notifications()
        if n.at >= since
    ]


def _run(fleet: Fleet, tmp: Path, name: str, *load: str) -> dict[str, Any]:
    start, end, summary = fleet.run_load(tmp / name, *load)
    time.sleep(15)  # the rules' last evaluations and Alertmanager's group wait
    figures = fleet_figures(fleet.prometheus, start, time.time())
    overall = summary["overall"]
    return {
        "policy": fleet.router.policy if fleet.router else None,
        "replicas": len([r for r in fleet.replicas if not r.killed]),
        "requests": overall.get("requests"),
        "failed": overall.get("failed"),
        "ttft": overall.get("ttft"),
        "output_tokens_per_s": overall.get("output_token_throughput"),
        "load_wall_s": round(end - start, 1),
        "fleet": figures.as_json(),
        "notifications": _notes(fleet, start),
    }


def imbalance(ns: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    pile = PileSpec(replicas=2, rate=ns.rate, duration_s=ns.duration)
    trace = tmp / "pile.jsonl"
    session_pile_trace(trace, pile)
    load = ("--trace", str(trace), "--trace-block-tokens", str(pile.block_tokens))
    spec = FleetSpec(replicas=2, kv_blocks=ns.kv_blocks, policy="round_robin",
                     max_model_len=pile.long_max_tokens + pile.output_tokens + 64,
                     rules_for_scale=FOR_SCALE)  # fmt: skip
    with Fleet(spec, work_dir=tmp / "fleet", echo=True) as fleet:
        rr = _run(fleet, tmp, "round-robin", *load)
        fleet.set_policy("cache_aware")
        time.sleep(70)  # the 1-minute windows forget the round-robin run
        ca = _run(fleet, tmp, "cache-aware", *load)
    return {"workload": pile.__dict__, "kv_blocks": ns.kv_blocks, "runs": [rr, ca]}


def _advice(fleet: Fleet) -> dict[str, Any]:
    (obs,) = fleets_from_prometheus(fleet.prometheus, window="3m", step="1s")
    return advise_fleet(obs, DEFAULT_THRESHOLDS.pressure_kv).to_dict()


def shortage(ns: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Closed-loop streams of one size, more than two replicas hold: the fleet page once, the
    advice's replicas, then that many replicas (registered with the router) and the same load."""
    load = ("--stage", f"concurrency:n={ns.streams}@{ns.duration:g}s", "--input-len", "1024",
            "--output-len", "512")  # fmt: skip
    spec = FleetSpec(replicas=2, kv_blocks=ns.kv_blocks, policy="cache_aware",
                     max_model_len=2048, rules_for_scale=FOR_SCALE)  # fmt: skip
    with Fleet(spec, work_dir=tmp / "fleet", echo=True) as fleet:
        short = _run(fleet, tmp, "two-replicas", *load, "--seed", "5")
        advice = _advice(fleet)
        more = advice["replicas_needed"] - len(fleet.replicas)
        added = fleet.add_replicas(more) if more > 0 else []
        n = len(fleet.replicas)
        wait_for_series(fleet.prometheus, f'count(up{{job="kvwatch"}} == 1) == {n}', 60)
        time.sleep(70)  # the 1-minute windows forget the first run
        # the same load with new prompts: cache_aware keeps a prompt it has seen on the replica
        # that served it, and balances only once queues differ by --balance-abs-threshold, so
        # the first run's prompts again went all to the first two (judged imbalance: the
        # results' scale-out-same-prompts run)
        scaled = _run(fleet, tmp, f"{n}-replicas", *load, "--seed", "6")
    return {"streams": ns.streams, "kv_blocks": ns.kv_blocks, "advice": advice,
            "added": len(added), "runs": [short, scaled]}  # fmt: skip


def kill(ns: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Three replicas under a load two can hold; one killed a third of the way in."""
    load = ("--stage", f"concurrency:n={ns.streams}@{ns.duration:g}s", "--input-len", "1024",
            "--output-len", "512", "--seed", "6")  # fmt: skip
    spec = FleetSpec(replicas=3, kv_blocks=ns.kv_blocks, policy="cache_aware",
                     max_model_len=2048, rules_for_scale=FOR_SCALE)  # fmt: skip
    with Fleet(spec, work_dir=tmp / "fleet", echo=True) as fleet:
        victim = fleet.replicas[2].url.removeprefix("http://")
        timer = threading.Timer(ns.duration / 3, fleet.kill, args=(2,))
        timer.start()
        run = _run(fleet, tmp, "kill", *load)
        timer.join()
    return {"streams": ns.streams, "kv_blocks": ns.kv_blocks, "killed": victim, "run": run}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("proof", choices=["imbalance", "shortage", "kill"])
    ap.add_argument("--streams", type=int, help="closed-loop streams (shortage 30, kill 12)")
    ap.add_argument("--kv-blocks", type=int, default=900, help="KV blocks per replica (900)")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second (4)")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of load per run (90)")
    ap.add_argument("--save", type=Path, help="write the figures as JSON here too")
    ns = ap.parse_args()
    if ns.streams is None:
        ns.streams = {"shortage": 30, "kill": 12}.get(ns.proof, 0)
    with tempfile.TemporaryDirectory(prefix="kvwatch-bench-fleet-") as d:
        result = {"imbalance": imbalance, "shortage": shortage, "kill": kill}[ns.proof](ns, Path(d))
    text = json.dumps(result, indent=1)
    print(text)
    if ns.save:
        ns.save.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
