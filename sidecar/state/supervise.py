"""Every background loop of the sidecar runs supervised: an exception is logged (one line per
loop, at most once a minute), counted, and the loop starts again after a backoff. A loop that
dies quietly while the sidecar says "up" is worse than no sidecar.

Each loop calls `beat(name)` after a good round, which clears its failing mark; `status()` is
what `/healthz`, `/api/state` and `kvwatch_internal_errors_total{loop}` show.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kvwatch.common.backoff import backoff_s

__all__ = ["LoopStatus", "Supervisor"]

log = logging.getLogger("kvwatch.sidecar")

_A = TypeVar("_A")
_LOG_EVERY_S = 60.0
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class LoopStatus:
    errors: int = 0  # exceptions caught since the sidecar started
    last_error: str | None = None
    last_error_unix: float | None = None
    failing: bool = False  # the last run raised, and no good round since


class Supervisor:
    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = wall_clock
        self._lock = threading.Lock()
        self._loops: dict[str, LoopStatus] = {}
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def beat(self, name: str) -> None:
        """A good round of the loop."""
        with self._lock:
            st = self._loops.get(name)
            if st is None:
                self._loops[name] = LoopStatus()
            elif st.failing:
                self._loops[name] = replace(st, failing=False)

    def failed(self, name: str, error: BaseException) -> int:
        """Count and (rate-limited) log one failure; returns the loop's failures so far."""
        now = self._clock()
        text = f"{type(error).__name__}: {error}"[:500]
        with self._lock:
            st = self._loops.get(name, LoopStatus())
            errors = st.errors + 1
            self._loops[name] = LoopStatus(errors, text, now, True)
            last = self._logged.get(name)
            if last is not None and now - last < _LOG_EVERY_S:
                self._unlogged[name] = self._unlogged.get(name, 0) + 1
                return errors
            self._logged[name] = now
            more = self._unlogged.pop(name, 0)
        extra = f" ({more} more since the last report)" if more else ""
        log.error("kvwatch sidecar: the %s loop failed and restarts: %s%s", name, text, extra)
        return errors

    def guard(self, name: str, fn: Callable[[_A], None]) -> Callable[[_A], None]:
        """`fn` for a callback another loop drives (a log reader's sink): an exception is
        counted and logged as this loop's, and the caller goes on."""

        def guarded(arg: _A) -> None:
            try:
                fn(arg)
            except Exception as e:  # noqa: BLE001
                self.failed(name, e)
            else:
                self.beat(name)

        return guarded

    def status(self) -> dict[str, LoopStatus]:
        with self._lock:
            return dict(self._loops)

    async def run(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run the coroutine `body()` makes until it returns; restart it when it raises."""
        self.beat(name)
        failures = 0
        while True:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the point: nothing ends the loop)
                failures = self.failed(name, e)
            await asyncio.sleep(min(_MAX_BACKOFF_S, backoff_s(failures)))

    def thread(
        self, name: str, body: Callable[[], None], stop: threading.Event
    ) -> threading.Thread:
        """Run `body()` in a daemon thread until it returns or `stop` is set; restart it when it
        raises."""

        def run() -> None:
            self.beat(name)
            failures = 0
            while not stop.is_set():
                try:
                    body()
                    return
                except Exception as e:  # noqa: BLE001
                    failures = self.failed(name, e)
                stop.wait(min(_MAX_BACKOFF_S, backoff_s(failures)))

        th = threading.Thread(target=run, name=f"kvwatch-{name}", daemon=True)
        th.start()
        return th
