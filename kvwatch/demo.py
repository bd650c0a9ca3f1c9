"""`kvwatch demo`: a real vLLM driven from healthy into preemption, watched by the sidecar.

Starts (or points at) a vLLM server, runs the sidecar beside it in its own process, sends a light
phase then a heavy one, shows a live line per second, and writes a run directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from kvwatch.cli import EXIT_UNREACHABLE, CliError
from loadgen.burst import run_burst
from loadgen.local_server import LocalVLLM, ServerConfig, ServerStartError, free_port
from loadgen.records import RequestRecord

__all__ = ["register"]

_SIDECAR_READY_S = 30.0


def register(sub: Any) -> None:
    d = sub.add_parser(
        "demo",
        help="start a local vLLM, drive it into preemption, and watch it with the sidecar",
        description="Build the tiny model, start vLLM (CPU) with a small KV cache, run the "
        "sidecar beside it, send a light phase then a heavy phase of streaming requests, show "
        "KV usage and preemptions live, and write everything to a run directory.",
    )
    d.add_argument("--target", metavar="URL", help="use this running vLLM instead of starting one")
    d.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=10 * 1024 * 1024,
        help="KV budget of the local server (default 10 MiB = 40 blocks)",
    )
    d.add_argument("--light", type=int, default=3, help="concurrent streams, light phase (3)")
    d.add_argument("--heavy", type=int, default=32, help="concurrent streams, heavy phase (32)")
    d.add_argument("--max-tokens", type=int, default=300, help="tokens per request (300)")
    d.add_argument("--rounds", type=int, default=1, help="heavy phases to run (1); more = longer")
    d.add_argument("--run-dir", type=Path, help="where to write the run (default runs/demo-TIME)")
    d.set_defaults(func=_demo)


def _start_sidecar(
    target: str, log: Path | None, run_dir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "kvwatch",
        "sidecar",
        "--target",
        target,
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "1",
        "--short-window",
        "5",
    ]
    if log is not None:
        cmd += ["--log", str(log), "--log-from-start"]
    err = open(run_dir / "sidecar.log", "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _SIDECAR_READY_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise CliError("the sidecar did not start; see " + str(run_dir / "sidecar.log"))


def _engine(state: dict[str, Any]) -> dict[str, Any] | None:
    """The first engine the sidecar sees now: its signals plus its state."""
    for t in state["targets"]:
        for e in t["engines"]:
            if e["present"]:
                return dict(e["signals"], state=e["state"])
    return None


class _LiveView:
    """Prints one line a second from the sidecar's state, and keeps the peaks."""

    def __init__(self, sidecar: str) -> None:
        self.sidecar = sidecar
        self.phase = "start"
        self.peak_kv = 0.0
        self.peak_rate = 0.0
        self.last: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        print(
            f"{'phase':<7} {'state':<10} {'KV used':>7} {'preempt/s':>9} {'running':>7} "
            f"{'waiting':>7} {'gen tok/s':>9}"
        )
        with httpx.Client(timeout=2) as client:
            while not self._stop.wait(1.0):
                try:
                    sig = _engine(client.get(self.sidecar + "/api/state").json())
                except (httpx.HTTPError, ValueError):
                    continue
                if sig is None or sig["kv_usage"] is None:
                    continue
                self.last = sig
                rate = sig["preemptions_per_s_short"] or 0.0
                self.peak_kv = max(self.peak_kv, sig["kv_usage"])
                self.peak_rate = max(self.peak_rate, rate)
                print(
                    f"{self.phase:<7} {sig['state']:<10} {sig['kv_usage']:>7.0%} {rate:>9.1f} "
                    f"{sig['running'] or 0:>7.0f} {sig['waiting'] or 0:>7.0f} "
                    f"{sig['generation_tokens_per_s'] or 0:>9.0f}",
                    flush=True,
                )

    def __enter__(self) -> _LiveView:
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _demo(ns: argparse.Namespace) -> int:
    from loadgen.tiny_model import build_tiny_model

    run_dir = ns.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    records: list[RequestRecord] = []
    with ExitStack() as stack:
        if ns.target:
            base, log = ns.target.rstrip("/"), None
        else:
            print("building the tiny model ...", flush=True)
            cfg = ServerConfig(model=build_tiny_model(), kv_cache_memory_bytes=ns.kv_cache_bytes)
            log = (run_dir / "vllm.log").resolve()
            print(f"starting vLLM (log: {log}) ...", flush=True)
            try:
                server = stack.enter_context(LocalVLLM(cfg, log_path=log))
            except ServerStartError as e:
                raise CliError(str(e), EXIT_UNREACHABLE) from None
            base = server.base_url
        side, side_url = _start_sidecar(base, log, run_dir)
        stack.callback(lambda: (side.terminate(), side.wait(15)))
        print(f"vLLM at {base}; sidecar at {side_url}/metrics", flush=True)
        with _LiveView(side_url) as view:
            view.phase = "light"
            records += asyncio.run(run_burst(base, ns.light, ns.max_tokens, seed=100))
            for i in range(ns.rounds):
                view.phase = "heavy"
                records += asyncio.run(run_burst(base, ns.heavy, ns.max_tokens, seed=200 + i))
            view.phase = "idle"
            time.sleep(3)
        state = httpx.get(side_url + "/api/state", timeout=5).json()
    (run_dir / "sidecar-state.json").write_text(json.dumps(state, indent=1))
    with (run_dir / "requests.jsonl").open("w") as fh:
        for r in records:
            fh.write(json.dumps(r.to_dict()) + "\n")
    sig = _engine(state) or view.last or {}
    ok = [r for r in records if r.ok]
    gaps = [g for r in ok for g in r.gaps]
    print()
    print(
        f"requests: {len(ok)}/{len(records)} completed; "
        f"TTFT p50 {_pct([r.ttft for r in ok if r.ttft], 0.5):.2f} s, "
        f"p99 {_pct([r.ttft for r in ok if r.ttft], 0.99):.2f} s; "
        f"largest inter-token gap {max(gaps, default=0):.2f} s"
    )
    print(
        f"KV cache: {sig.get('capacity_blocks')} blocks of {sig.get('block_size')} tokens; "
        f"peak usage {view.peak_kv:.0%}"
    )
    print(
        f"preemptions seen by the sidecar: {sig.get('preemptions_observed', 0):.0f} "
        f"(peak {view.peak_rate:.1f}/s)"
    )
    _print_advice(state)
    print(f"run directory: {run_dir}")
    return 0


def _print_advice(state: dict[str, Any]) -> None:
    from kvwatch.advise_cmd import observed_from_state
    from sidecar.advice import advise
    from sidecar.kvmath import SizingError

    try:
        (name, obs), *_ = observed_from_state(state, "the demo's sidecar")
    except SizingError as e:
        print(f"advice: not enough seen yet ({e})")
        return
    adv = advise(obs)
    print(f"advice: {adv.verdict}")
    for line in adv.options[:2]:
        print(f"  {line}")
