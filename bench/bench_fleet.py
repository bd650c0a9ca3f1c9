"""The fleet proofs, on twins behind vllm-router (kvwatch/fleet/lab.py), results in docs/fleet.md.

- `imbalance`: round-robin routing of a session workload that piles the long conversations on
  one replica (kvwatch/fleet/workloads.py): the fleet rules judge imbalance and name the
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
import time
from pathlib import Path
from typing import Any

from kvwatch.fleet.figures import fleet_figures
from kvwatch.fleet.lab import Fleet, FleetSpec
from kvwatch.fleet.workloads import PileSpec, session_pile_trace

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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("proof", choices=["imbalance"])
    ap.add_argument("--kv-blocks", type=int, default=2000, help="KV blocks per replica (2000)")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second (4)")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of load per run (90)")
    ap.add_argument("--save", type=Path, help="write the figures as JSON here too")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvwatch-bench-fleet-") as d:
        result = {"imbalance": imbalance}[ns.proof](ns, Path(d))
    text = json.dumps(result, indent=1)
    print(text)
    if ns.save:
        ns.save.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
