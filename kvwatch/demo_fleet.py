"""`kvwatch demo --fleet N`: a fleet ramped from healthy into a shortage of KV, with everything
kvwatch does for a fleet: N twins behind vllm-router (cache-aware), a sidecar each, Prometheus
with kvwatch's rules, Alertmanager with kvwatch's routing. Prints each replica's state and the
fleet's figures every few seconds and each notification Alertmanager sends, then the fleet
advice (how many replicas end it). Everything it starts it stops."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_UNREACHABLE, CliError, make_dir
from kvwatch.fleet.lab import Fleet, FleetSpec
from kvwatch.fleet.prometheus import query
from kvwatch.local.server import ServerStartError
from kvwatch.sidecar.contract import catalogue as cat

__all__ = ["run_fleet_demo"]

_FOR_SCALE = 1 / 30  # the rules' 5 minutes are 10 s: a demo shows the judgement, not the wait


class _FleetView:
    """A line every 5 s from Prometheus: each replica's KV usage and the fleet's counts."""

    def __init__(self, prometheus: str) -> None:
        self.prometheus = prometheus
        self.failed = 0  # reads that failed; said at the end, not dropped
        self.last_error = ""
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _value(self, promql: str) -> str:
        rows = query(self.prometheus, promql)
        return "-" if not rows else f"{float(rows[0]['value'][1]):g}"

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            try:
                kv = query(self.prometheus, cat.REC_KV_USAGE.name)
                usage = " ".join(f"{float(r['value'][1]):.0%}" for r in
                                 sorted(kv, key=lambda r: r["metric"]["instance"]))  # fmt: skip
                line = (
                    f"KV per replica [{usage}]  out of KV "
                    f"{self._value(cat.REC_FLEET_SHORT.name)}  with room "
                    f"{self._value(cat.REC_FLEET_ROOM.name)}  replicas needed "
                    f"{self._value(cat.REC_FLEET_REPLICAS_NEEDED.name)}"
                )
            except (CliError, OSError, ValueError, KeyError) as e:
                self.failed += 1
                self.last_error = str(e)[:200]
                continue
            print(line, flush=True)

    def __enter__(self) -> _FleetView:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()
        if self.failed:
            print(f"(the live view could not read Prometheus {self.failed} time(s); last: "
                  f"{self.last_error})", flush=True)  # fmt: skip


def run_fleet_demo(ns: argparse.Namespace) -> int:
    from kvwatch.advise.fleet_source import fleets_from_prometheus
    from kvwatch.loadgen.workload.schedule import ramp_stages
    from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS
    from kvwatch.sizing.errors import SizingError
    from kvwatch.sizing.fleet import advise_fleet

    if ns.fleet < 2:
        raise CliError("--fleet takes 2 or more replicas")
    model, sep, gpu = (ns.twin or "llama-3.1-8b:h100").rpartition(":")
    if not sep:
        raise CliError("--twin takes MODEL:GPU (e.g. llama-3.1-8b:h100)")
    run_dir = make_dir(
        ns.run_dir or Path("runs") / time.strftime("demo-fleet-%Y%m%d-%H%M%S"), "the run directory"
    )
    spec = FleetSpec(replicas=ns.fleet, model=model, gpu=gpu, kv_blocks=ns.twin_blocks,
                     max_model_len=2048, policy="cache_aware",
                     rules_for_scale=_FOR_SCALE)  # fmt: skip
    print(f"starting a fleet of {ns.fleet} kvwatch twins ({model} on a simulated {gpu}, "
          f"{ns.twin_blocks} KV blocks each) behind vllm-router ...", flush=True)  # fmt: skip
    try:
        with Fleet(spec, work_dir=run_dir / "fleet", echo=True) as fleet:
            print(f"router {fleet.url}; Prometheus {fleet.prometheus}; Alertmanager "
                  f"{fleet.alertmanager}", flush=True)  # fmt: skip
            stages = ramp_stages(ns.light * ns.fleet, ns.heavy * ns.fleet, ns.rounds)
            args = ["--seed", "7", "--input-len", "30", "--output-len", str(ns.max_tokens)]
            args += [x for s in stages for x in ("--stage", s)]
            with _FleetView(fleet.prometheus):
                _, _, summary = fleet.run_load(run_dir / "load", *args)
                time.sleep(15)  # the rules' last evaluations and Alertmanager's group wait
            fleets = [advise_fleet(f, DEFAULT_THRESHOLDS.pressure_kv)
                      for f in fleets_from_prometheus(fleet.prometheus, "10m", "1s")]  # fmt: skip
            notes = fleet.receiver.notifications()
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    except SizingError as e:
        raise CliError(str(e)) from None
    _write(run_dir, summary, [f.to_dict() for f in fleets], notes)
    pages = [n for n in notes if n.path == "/inference" and n.status == "firing"]
    print(f"\n{len(pages)} page(s) sent: " + "; ".join(sorted({", ".join(sorted(n.names))
                                                                for n in pages})))  # fmt: skip
    for f in fleets:
        print(f"\nfleet {f.model}: {f.verdict}")
        print("\n".join(f"  {x}" for x in f.arithmetic + f.options))
    print(f"\nrun directory: {run_dir}")
    return EXIT_FOUND if any(f.options for f in fleets) else 0


def _write(run_dir: Path, summary: dict[str, Any], fleets: list[Any], notes: list[Any]) -> None:
    (run_dir / "fleet-advice.json").write_text(json.dumps(fleets, indent=1))
    (run_dir / "notifications.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "at": n.at,
                    "path": n.path,
                    "status": n.status,
                    "group": n.group_labels,
                    "alerts": sorted(n.names),
                }
            )
            + "\n"
            for n in notes
        )  # fmt: skip
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
