"""`kvwatch demo`: a real vLLM ramped from healthy into thrashing, with everything kvwatch does.

Each part runs as it would in production, in its own process: vLLM (CPU, tiny model, small KV
cache), the sidecar beside it (metrics and the server's log, a webhook to a local receiver),
and `kvwatch loadgen run` for the load. The demo prints a live line a second, prints each alert
as the receiver gets it, then the sizing advice, and writes a run directory with the report,
the dashboards and the rules. It stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from kvwatch.common.cli_kit import EXIT_FOUND, EXIT_UNREACHABLE, CliError, make_dir
from kvwatch.common.post_receiver import PostReceiver
from kvwatch.fleet.sidecars import start_sidecar
from kvwatch.loadgen.workload.schedule import ramp_stages
from kvwatch.local.server import (
    LocalVLLM,
    ServerConfig,
    ServerStartError,
    stop_process,
)
from kvwatch.sidecar.state.views import EngineView, engines_from_json

__all__ = ["run_demo", "AlertReceiver"]


class AlertReceiver(PostReceiver):
    """A local webhook receiver for the sidecar's alerts (its `url`): prints each one as it
    arrives; a body that is not JSON is counted in `refused`."""

    def __init__(self) -> None:
        super().__init__()
        self.url = self.base + "/hook"
        self.alerts: list[dict[str, Any]] = []
        self.refused = 0

    def take(self, path: str, body: bytes) -> None:
        try:
            alert = json.loads(body)
            summary = (alert.get("annotations") or {}).get("summary", "")
        except (ValueError, AttributeError):
            self.refused += 1
            return
        self.alerts.append(alert)
        print(f">>> webhook: {alert.get('status')} {alert.get('alertname')}: {summary}", flush=True)


def _engine(state: dict[str, Any]) -> EngineView | None:
    """The first engine the sidecar sees now."""
    return next((e for _, e in engines_from_json(state) if e.present), None)


class _LiveView:
    """Prints one line a second from the sidecar's state, and keeps the peaks."""

    def __init__(self, sidecar: str) -> None:
        self.sidecar = sidecar
        self.peak_kv = 0.0
        self.peak_rate = 0.0
        self.last: EngineView | None = None
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        print(
            f"{'stage':<22} {'state':<10} {'KV used':>7} {'preempt/s':>9} {'running':>7} "
            f"{'waiting':>7} {'gen tok/s':>9}"
        )
        with httpx.Client(timeout=2) as client:
            while not self._stop.wait(1.0):
                try:
                    state = client.get(self.sidecar + "/api/state").json()
                    eng = _engine(state)
                except (httpx.HTTPError, ValueError):
                    continue
                sig = None if eng is None else eng.signals
                if eng is None or sig is None or sig.kv_usage is None:
                    continue
                stage = next(iter(state.get("load", {}).get("stages", {})), "-")
                self.last = eng
                rate = sig.preemptions_per_s_short or 0.0
                self.peak_kv = max(self.peak_kv, sig.kv_usage)
                self.peak_rate = max(self.peak_rate, rate)
                print(
                    f"{stage:<22} {eng.state:<10} {sig.kv_usage:>7.0%} {rate:>9.1f} "
                    f"{sig.running or 0:>7.0f} {sig.waiting or 0:>7.0f} "
                    f"{sig.generation_tokens_per_s or 0:>9.0f}",
                    flush=True,
                )

    def __enter__(self) -> _LiveView:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()


def run_demo(ns: argparse.Namespace) -> int:
    from kvwatch.local.tiny_model import build_tiny_model

    if getattr(ns, "fleet", None) is not None:
        from kvwatch.demo_fleet import run_fleet_demo

        return run_fleet_demo(ns)

    run_dir = make_dir(
        ns.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"), "the run directory"
    )
    with ExitStack() as stack:
        if ns.target:
            base, log = ns.target.rstrip("/"), None
        elif ns.twin:
            log = (run_dir / "vllm.log").resolve()
            base = _start_twin(stack, ns.twin, ns.twin_blocks, log)
        else:
            print("building the tiny model ...", flush=True)
            cfg = ServerConfig(
                model=build_tiny_model(), kv_cache_memory_bytes=ns.kv_cache_bytes, nice=10
            )
            log = (run_dir / "vllm.log").resolve()
            print(f"starting vLLM (log: {log}) ...", flush=True)
            try:
                server = stack.enter_context(LocalVLLM(cfg, log_path=log))
            except ServerStartError as e:
                raise CliError(str(e), EXIT_UNREACHABLE) from None
            base = server.base_url
        receiver = stack.enter_context(AlertReceiver())
        side, side_url = start_sidecar(base, run_dir, log=log, webhook=receiver.url)
        stack.callback(stop_process, side)
        print(f"vLLM at {base}; sidecar at {side_url}/metrics; alerts to {receiver.url}")
        stages = ramp_stages(ns.light, ns.heavy, ns.rounds)
        cmd = [
            sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", base,
            "--run-dir", str(run_dir), "--sidecar", side_url, "--no-progress", "--seed", "7",
            "--input-len", "30", "--output-len", str(ns.max_tokens), "--json",
            *[x for s in stages for x in ("--stage", s)],
        ]  # fmt: skip
        with _LiveView(side_url) as view:
            load = subprocess.run(cmd, capture_output=True, text=True)
            time.sleep(3)  # the sidecar sees the last of it
        if load.returncode not in (0, EXIT_FOUND):
            # its own last line, without its "kvwatch: error:", and its exit code (3: the
            # target could not be reached is not bad usage)
            said = (load.stderr.strip().splitlines() or ["(nothing said)"])[-1]
            said = said.removeprefix("kvwatch: error: ")[-500:]
            code = load.returncode if load.returncode in (2, 3) else EXIT_UNREACHABLE
            raise CliError(f"the load generator failed: {said}", code)
        state = httpx.get(side_url + "/api/state", timeout=5).json()
        time.sleep(1)  # a webhook in flight lands before the receiver stops
        alerts = list(receiver.alerts)
    _write_extras(run_dir, state, alerts)
    _print_summary(run_dir, state, view, alerts)
    return 0 if load.returncode == 0 else EXIT_FOUND


def _start_twin(stack: ExitStack, spec: str, blocks: int, log: Path) -> str:
    """The twin for `--twin MODEL:GPU`, with a cache of `blocks` blocks; its base URL."""
    from kvwatch.sizing.errors import SizingError
    from kvwatch.twin.serve import kv_bytes_for_blocks, start_twin

    model, sep, gpu = spec.rpartition(":")
    if not sep or not model or not gpu or blocks < 1:
        raise CliError("--twin takes MODEL:GPU (e.g. llama-3.1-8b:h100) and --twin-blocks >= 1")
    try:
        kv_bytes = kv_bytes_for_blocks(model, gpu, blocks, 2048)
    except SizingError as e:
        raise CliError(str(e)) from None
    print(f"starting the kvwatch twin: {model} on a simulated {gpu} (log: {log}) ...", flush=True)
    try:
        twin = start_twin(
            model, gpu, log,
            vllm_args=("--max-model-len", "2048",
                       "--kv-cache-memory-bytes", str(kv_bytes)),
        )  # fmt: skip
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    stack.callback(twin.stop)
    print(f"  {twin.capacity_line()} (simulated card; vLLM's own engine)", flush=True)
    return twin.base_url


def _write_extras(run_dir: Path, state: dict[str, Any], alerts: list[dict[str, Any]]) -> None:
    """The sidecar's last state, the alerts, the dashboards, the rules and the report."""
    from kvwatch.alerts.build import write_all as write_rules
    from kvwatch.dashboards.build import write_all as write_dashboards
    from kvwatch.loadgen.results.run_files import read_run
    from kvwatch.loadgen.results.rundir import write_jsonl
    from kvwatch.report.run_page import render_report

    (run_dir / "sidecar-state.json").write_text(json.dumps(state, indent=1))
    write_jsonl(run_dir / "alerts.jsonl", alerts)
    write_dashboards(run_dir / "dashboards")
    write_rules(run_dir / "alerts")
    (run_dir / "report.html").write_text(render_report(read_run(run_dir)))


def _print_summary(
    run_dir: Path, state: dict[str, Any], view: _LiveView, alerts: list[dict[str, Any]]
) -> None:
    from kvwatch.loadgen.results.run_observed import observed_from_dir
    from kvwatch.loadgen.results.summary import render_table
    from kvwatch.sizing.advice import advise
    from kvwatch.sizing.errors import SizingError

    full = json.loads((run_dir / "summary.json").read_text())
    summary = full["overall"]
    eng = _engine(state) or view.last
    sig = None if eng is None else eng.signals
    nan = float("nan")
    ttft = summary.get("ttft") or {}
    print()
    print(render_table(full))
    print(
        f"requests: {summary['completed']}/{summary['requests']} completed; "
        f"TTFT p50 {ttft.get('p50', nan):.2f} s, p99 {ttft.get('p99', nan):.2f} s; "
        f"largest inter-token gap {(summary.get('itl') or {}).get('max', 0):.2f} s; "
        f"{summary.get('stalls', 0)} stalls"
    )
    print(
        f"KV cache: {sig and sig.capacity_blocks} blocks of {sig and sig.block_size} tokens; "
        f"peak usage {view.peak_kv:.0%}"
    )
    print(
        f"preemptions seen by the sidecar: {sig.preemptions_observed if sig else 0:.0f} "
        f"(peak {view.peak_rate:.1f}/s); alerts delivered to the webhook: {len(alerts)}"
    )
    try:
        observed, server = observed_from_dir(run_dir)
        adv = advise(observed, server=server)
    except SizingError as e:
        print(f"advice: not enough seen ({e})")
    else:
        print(f"advice: {adv.verdict}")
        for line in adv.options[:2]:
            print(f"  {line}")
    print(f"run directory: {run_dir}  (report: {run_dir / 'report.html'})")
