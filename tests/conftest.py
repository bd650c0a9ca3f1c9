"""Shared fixtures. One real vLLM server per test session; tests that need it are `integration`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from kvwatch.local.tiny_model import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real vLLM (CPU) with 40 KV blocks of 32 tokens: 32 concurrent 150-token streams preempt
    (tests/burst.py: THRASH_N, THRASH_TOKENS)."""
    from kvwatch.local.server import LocalVLLM, ServerConfig

    where = tmp_path_factory.mktemp("vllm")
    # its KV events on a Unix socket (tests/sidecar/test_kv_events_live.py): vLLM binds a tcp
    # endpoint on every interface, and these tests listen on loopback only
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": kv_events_endpoints(where)[0],
                         "replay_endpoint": kv_events_endpoints(where)[1]})  # fmt: skip
    # nice 10: the observers under test get their CPU, as beside a GPU server (docs/testing.md)
    with LocalVLLM(
        ServerConfig(model=tiny_model, nice=10, extra_args=("--kv-events-config", config)),
        log_path=where / "vllm.log",
    ) as server:
        yield server


def kv_events_endpoints(server_dir: Path) -> tuple[str, str]:
    """The shared server's KV event publisher and its replay endpoint."""
    return f"ipc://{server_dir}/kv-events.sock", f"ipc://{server_dir}/kv-replay.sock"


@pytest.fixture
def data_dir() -> Path:
    return DATA


# Live tests that run a stalled load once more say so here; CI's output ends with one
# `KVWATCH-RETRY` line per retry, so a rising retry rate shows (grep -c KVWATCH-RETRY).
_RETRIES: list[str] = []


@pytest.fixture
def live_retry(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with why, each time a live test runs its load again."""

    def note(why: str) -> None:
        _RETRIES.append(f"{request.node.nodeid}: {why}")

    return note


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.section(f"live-test retries: {len(_RETRIES)}")
    for line in _RETRIES:
        terminalreporter.write_line(f"KVWATCH-RETRY {line}")
