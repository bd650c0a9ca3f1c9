"""The supervisor: a loop or thread that fails restarts, is counted, and recovers."""

from __future__ import annotations

import asyncio
import threading

from kvwatch.sidecar.state.supervise import Supervisor


class TestSupervisor:
    def test_a_failing_loop_restarts_is_counted_and_recovers(self) -> None:
        sup = Supervisor()
        runs: list[int] = []

        async def body() -> None:
            runs.append(1)
            if len(runs) < 3:
                raise ValueError(f"boom {len(runs)}")
            sup.beat("x")

        asyncio.run(asyncio.wait_for(sup.run("x", body), 10))
        st_ = sup.status()["x"]
        assert len(runs) == 3 and st_.errors == 2 and not st_.failing
        assert st_.last_error == "ValueError: boom 2"

    def test_guard_keeps_the_caller_going(self) -> None:
        sup = Supervisor()

        def sink(lines: list[str]) -> None:
            raise RuntimeError("bad line")

        guarded = sup.guard("log", sink)
        guarded(["a"])
        guarded(["b"])
        assert sup.status()["log"].errors == 2 and sup.status()["log"].failing

    def test_a_thread_restarts_until_stopped(self) -> None:
        sup, stop, calls = Supervisor(), threading.Event(), []

        def body() -> None:
            calls.append(1)
            if len(calls) >= 2:
                stop.set()
            raise OSError("disk")

        sup.thread("log", body, stop).join(10)
        assert len(calls) == 2 and sup.status()["log"].errors == 2
