"""`kvwatch fleet`: bring the fleet up, print where everything is, wait for Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError, make_dir
from kvwatch.fleet.lab import (
    REPLICA_BYTES,
    Fleet,
    FleetSpec,
    available_memory,
    memory_needed,
    parallel_starts,
)
from kvwatch.fleet.router import POLICIES
from kvwatch.local.server import ServerStartError
from kvwatch.sizing.errors import SizingError

__all__ = ["run_fleet"]


def run_fleet(ns: argparse.Namespace) -> int:
    if ns.replicas < 1 or ns.kv_blocks < 1 or ns.time_scale <= 0 or ns.rules_for_scale <= 0:
        raise CliError("--replicas and --kv-blocks take 1 or more; the scales must be above 0")
    if ns.policy not in POLICIES:
        raise CliError(f"--policy {ns.policy!r}: one of {', '.join(POLICIES)}")
    spec = FleetSpec(
        replicas=ns.replicas, model=ns.model, gpu=ns.gpu, kv_blocks=ns.kv_blocks,
        max_model_len=ns.max_model_len, time_scale=ns.time_scale, policy=ns.policy,
        rules_for_scale=ns.rules_for_scale,
    )  # fmt: skip
    if ns.work_dir is not None:
        make_dir(ns.work_dir, "the fleet's folder")
    need, have = memory_needed(ns.replicas), available_memory()
    if have is not None and need > have:
        raise CliError(
            f"--replicas {ns.replicas} needs about {need / 2**30:.1f} GiB of memory "
            f"({REPLICA_BYTES / 2**30:.1f} GiB a replica); this machine has {have / 2**30:.1f} "
            "GiB available"
        )
    print(f"starting {ns.replicas} twin replicas of {ns.model} on a simulated {ns.gpu} "
          f"({parallel_starts(ns.replicas)} at a time) ...", flush=True)  # fmt: skip
    stop = threading.Event()
    try:
        # while it starts, SIGTERM interrupts like Ctrl-C (Fleet's own handler): the starts
        # under way give up and everything started is stopped
        with Fleet(spec, work_dir=ns.work_dir, echo=True) as fleet:
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            for r in fleet.replicas:
                print(f"  replica {r.index}: {r.url} (kvwatch twin; sidecar {r.sidecar_url})")
            print(f"router ({fleet.url.split('//')[1]}, {ns.policy}): {fleet.url}")
            print(f"prometheus: {fleet.prometheus}")
            print(f"alertmanager: {fleet.alertmanager} (notifications print here)")
            print(f"logs and discovery files: {fleet.dir}")
            print("Ctrl-C stops everything.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
    except (ServerStartError, RuntimeError) as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    except SizingError as e:
        raise CliError(str(e)) from None
    print("stopped.")
    return 0
