"""The long-running sidecar: scrape loops, a log reader, the HTTP endpoint, and a clean shutdown.

The scrape loops run on asyncio in the main thread; the log reader and the HTTP server run in
threads. None of them can take the others down: every loop runs supervised
(sidecar/state/supervise.py), so an exception is logged, counted and the loop starts again, and
`/healthz` says which fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import httpx

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.kvevents.subscriber import KvEventFeed, check_endpoint
from kvwatch.sidecar.logs.follow import FileFollower, FollowStats, read_stream, run_and_read
from kvwatch.sidecar.metrics.scrape import check_health, fetch_version, metrics_url, scrape_once
from kvwatch.sidecar.outputs.alerting import AlertTracker, active_alerts
from kvwatch.sidecar.outputs.webhooks import Receiver, deliver_forever, enqueue
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sidecar.state.views import AlertingView
from kvwatch.sidecar.store.database import connect
from kvwatch.sidecar.store.episode_store import EpisodeStore
from kvwatch.sidecar.store.firing_store import FiringStore
from kvwatch.sidecar.store.outbox import Outbox
from kvwatch.sizing.archconfig import Architecture

__all__ = ["SidecarConfig", "serve_sidecar", "stop_command"]

_LOG_POLL_S = 0.2
_LOG_LOOP = "log"
_CHILD_STOP_WAIT_S = 60.0
# after the command exited, how long what it started has to follow (vLLM's EngineCore frees its
# GPU memory and exits once the API server has gone)
_GROUP_STOP_WAIT_S = 10.0


@dataclass(frozen=True)
class SidecarConfig:
    targets: tuple[str, ...]
    interval_s: float = 1.0
    timeout_s: float = 2.0
    listen_host: str = "127.0.0.1"
    listen_port: int = 9477
    log_path: Path | None = None  # Path("-") means stdin
    log_from_start: bool = False
    command: tuple[str, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    db_path: Path | None = None  # SQLite file for episodes; None keeps them in memory
    receivers: tuple[Receiver, ...] = ()
    model: Architecture | None = None  # --model: the served model's KV groups
    scheduling_policy: str | None = None  # --scheduling-policy; None: from the log
    kv_events: tuple[str, ...] = ()  # --kv-events: the nth belongs to the nth target
    kv_events_replay: tuple[str, ...] = ()  # --kv-events-replay, likewise

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("give at least one --target")
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("--interval and --timeout must be positive")
        if self.log_path is not None and self.command:
            raise ValueError("use either --log or a command after --, not both")
        if len(self.kv_events) > len(self.targets):
            raise ValueError("one --kv-events per --target at most (in the targets' order)")
        if len(self.kv_events_replay) > len(self.kv_events):
            raise ValueError("a --kv-events-replay belongs to a --kv-events (in order)")
        for e in (*self.kv_events, *self.kv_events_replay):
            check_endpoint(e)


async def _scrape_loop(
    client: httpx.AsyncClient,
    state: SidecarState,
    target: str,
    cfg: SidecarConfig,
    scraped: asyncio.Event,
) -> None:
    url = httpx.URL(metrics_url(target))  # parsed once, not once a scrape
    deadline = time.monotonic()
    while True:
        # stamped when it began, as Prometheus stamps its samples: the target counts at the
        # request, and a sidecar starved of CPU after the answer came would otherwise squeeze
        # two scrapes' worth of counting into a fraction of a second (a 13x rate was seen)
        began = time.monotonic()
        outcome = await scrape_once(client, url, cfg.timeout_s)
        # recorded in a worker thread: judging writes episodes to SQLite, and a slow disk must
        # hold up neither the next scrape nor the other targets' loops
        await asyncio.to_thread(state.record_scrape, target, began, outcome)
        if outcome.exposition is not None:
            ok, why = await check_health(client, target, cfg.timeout_s)
            state.record_health(target, time.monotonic(), ok, why)
        if state.wants_version(target, time.monotonic()):
            version = await fetch_version(client, target, cfg.timeout_s)
            state.record_version(target, time.monotonic(), version)
        state.loops.beat(f"scrape:{target}")
        scraped.set()  # the alert loop judges this scrape now, not on its own next tick
        deadline += cfg.interval_s
        delay = deadline - time.monotonic()
        if delay < 0:  # fell behind (slow target): skip the missed ticks, don't burst
            deadline = time.monotonic()
            delay = 0
        await asyncio.sleep(delay)


def _follow_file(follower: FileFollower, state: SidecarState, stop: threading.Event) -> None:
    while not stop.is_set():
        lines = follower.poll()
        if lines:
            state.record_log_lines(lines)
        state.loops.beat(_LOG_LOOP)
        stop.wait(_LOG_POLL_S)
    follower.close()


def _start_log_reader(
    cfg: SidecarConfig, state: SidecarState, stop: threading.Event, echo: BinaryIO
) -> subprocess.Popen[bytes] | None:
    """Start whichever log source the config names; returns the child process in command mode."""
    sink = state.loops.guard(_LOG_LOOP, state.record_log_lines)
    if cfg.command:
        stats = FollowStats()
        state.log_stats, state.log_source = stats, "command"
        proc, _ = run_and_read(cfg.command, sink, stats, echo=echo)
        return proc
    if cfg.log_path is None:
        return None
    if str(cfg.log_path) == "-":
        stats = FollowStats()
        state.log_stats, state.log_source = stats, "stdin"
        state.loops.thread(_LOG_LOOP, lambda: read_stream(sys.stdin.buffer, sink, stats), stop)
        return None
    follower = FileFollower(cfg.log_path, from_start=cfg.log_from_start)
    state.log_stats, state.log_source = follower.stats, str(cfg.log_path)
    state.loops.thread(_LOG_LOOP, lambda: _follow_file(follower, state, stop), stop)
    return None


def _start_kv_event_feeds(cfg: SidecarConfig, state: SidecarState, stop: threading.Event) -> None:
    """One thread per `--kv-events`: the server's KV events into its target's curve."""
    for i, endpoint in enumerate(cfg.kv_events):
        target = cfg.targets[i]
        replay = cfg.kv_events_replay[i] if i < len(cfg.kv_events_replay) else None
        feed = KvEventFeed(
            endpoint,
            functools.partial(state.record_kv_batch, target),
            functools.partial(state.record_kv_restart, target),
            replay,
        )
        state.follow_kv_events(target, feed.stats)
        name = f"kv-events:{target}"
        beat = functools.partial(state.loops.beat, name)
        state.loops.thread(name, functools.partial(feed.run, stop, beat), stop)


async def _alert_loop(
    cfg: SidecarConfig, state: SidecarState, external_url: str, scraped: asyncio.Event
) -> None:
    """Judge alerts as soon as a scrape is recorded (and at least once an interval) and queue
    their notifications; the sender is woken at once (the outbox keeps them until every
    receiver has them)."""
    th = cfg.thresholds
    # a restored alert stays until the engines have been judged afresh: the short window fills,
    # then a state that is truly gone takes exit_after_s to step down
    hold = th.short_window_s + th.exit_after_s + 2 * cfg.interval_s + cfg.timeout_s
    # a connection each: the tracker writes from the judging thread while the outbox is written
    # from the delivery's, and two threads' transactions must never share one connection
    firing = FiringStore(connect(cfg.db_path))
    tracker = AlertTracker(firing, th.repeat_interval_s, hold, state.started_unix)
    outbox = Outbox(connect(cfg.db_path))
    for r in cfg.receivers:
        outbox.rename(r.url, r.key)
    queued = asyncio.Event()
    sender = asyncio.create_task(
        state.loops.run(
            "webhooks",
            lambda: deliver_forever(
                outbox, list(cfg.receivers), wake=queued, beat=lambda: state.loops.beat("webhooks")
            ),
        )
    )

    def judge() -> bool:
        """One look at the alerts; True if notifications were queued. Runs in a worker thread
        (the tracker and the outbox write to SQLite) so the scrape loops never wait on it."""
        now = time.time()
        alerts = active_alerts(state.view(), th, now)
        notes = tracker.update(alerts.active, now, alerts.holding)
        if cfg.receivers and notes:
            enqueue(outbox, list(cfg.receivers), notes, external_url)
        state.set_alerting(AlertingView(tracker.firing_now(), outbox.stats()))
        return bool(cfg.receivers and notes)

    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(scraped.wait(), cfg.interval_s)
            scraped.clear()
            if await asyncio.to_thread(judge):
                queued.set()
            state.loops.beat("alerts")
    finally:
        sender.cancel()


async def _main(
    cfg: SidecarConfig,
    state: SidecarState,
    child: subprocess.Popen[bytes] | None,
    external_url: str = "",
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    limits = httpx.Limits(max_connections=len(cfg.targets) * 2)
    async with httpx.AsyncClient(limits=limits) as client:
        scraped = asyncio.Event()
        tasks = [
            asyncio.create_task(
                state.loops.run(
                    f"scrape:{t}", functools.partial(_scrape_loop, client, state, t, cfg, scraped)
                )
            )
            for t in cfg.targets
        ]
        tasks.append(
            asyncio.create_task(
                state.loops.run("alerts", lambda: _alert_loop(cfg, state, external_url, scraped))
            )
        )
        code = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if child is not None and child.poll() is not None:
                print(f"kvwatch sidecar: command exited with {child.returncode}", file=sys.stderr)
                code = child.returncode
                break
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if child is not None:
        code = await stop_command(child, code)
    return code


async def stop_command(
    child: subprocess.Popen[bytes],
    code: int,
    wait_s: float = _CHILD_STOP_WAIT_S,
    group_wait_s: float = _GROUP_STOP_WAIT_S,
) -> int:
    """Stop the command we started and everything it started: SIGTERM to it (vLLM's API server
    stops its EngineCore on it) and `wait_s` for it to exit; then, as it runs in a process group
    of its own (run_and_read), `group_wait_s` for the rest of the group, and SIGKILL to what is
    left (an EngineCore that hung, or survived a command that died). SIGKILL to the command
    only, as before, could leave its EngineCore holding the GPU. Its exit code, or `code`."""
    if child.poll() is None:
        child.terminate()
        try:
            code = await asyncio.to_thread(child.wait, wait_s)
        except subprocess.TimeoutExpired:
            group_wait_s = 0.0  # it hung: no more waiting for its children
    else:
        code = child.returncode
    deadline = time.monotonic() + group_wait_s
    while _group_alive(child.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    if child.poll() is None:
        code = await asyncio.to_thread(child.wait)
    return code


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def serve_sidecar(cfg: SidecarConfig, echo: BinaryIO | None = None) -> int:
    from kvwatch.sidecar.outputs.exporter import EVENTS_TOKEN_ENV, serve

    # `kill -USR1 PID` prints every thread's stack to stderr: what a sidecar that stopped
    # answering is doing, without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    stale_after = max(10.0, 3 * (cfg.interval_s + cfg.timeout_s))
    state = SidecarState(
        list(cfg.targets),
        cfg.thresholds,
        EpisodeStore(cfg.db_path),
        stale_after_s=stale_after,
        model=cfg.model,
        scheduling_policy=cfg.scheduling_policy,
    )
    server = serve(
        cfg.listen_host,
        cfg.listen_port,
        state.view,
        stale_after,
        state.episodes,
        state.record_load_event,
        os.environ.get(EVENTS_TOKEN_ENV) or None,
        state.readings_json,
    )
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(
        f"kvwatch sidecar: serving http://{host}:{port}/metrics, /healthz, /api/state, "
        "/api/readings; "
        f"watching {', '.join(cfg.targets)}",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    child = _start_log_reader(cfg, state, stop, echo or sys.stdout.buffer)
    _start_kv_event_feeds(cfg, state, stop)
    try:
        return asyncio.run(_main(cfg, state, child, f"http://{host}:{port}"))
    finally:
        stop.set()
        if child is not None and child.poll() is None:  # _main raised before it stopped it
            asyncio.run(stop_command(child, 1))
        server.shutdown()
        server.server_close()
