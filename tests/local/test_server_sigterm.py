"""A SIGTERM to a process inside `with LocalVLLM(...)` ends the `with`, so the server (in a
session of its own, which the signal does not reach) is stopped, not left running."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from kvwatch.local.server import restore_sigterm, sigterm_interrupts


@pytest.fixture
def default_sigterm() -> Iterator[None]:
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_interrupts_like_ctrl_c_and_is_put_back(default_sigterm: None) -> None:
    before = sigterm_interrupts()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
    restore_sigterm(before)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_somebody_set_is_left_alone(default_sigterm: None) -> None:
    def mine(signum: int, frame: object) -> None: ...

    signal.signal(signal.SIGTERM, mine)
    before = sigterm_interrupts()
    assert before is None
    assert signal.getsignal(signal.SIGTERM) is mine
    restore_sigterm(before)
    assert signal.getsignal(signal.SIGTERM) is mine
