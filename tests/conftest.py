"""Shared fixtures. One real vLLM server per test session; tests that need it are `integration`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from kvwatch.loadgen.tiny_model import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real vLLM (CPU) with 40 KV blocks of 32 tokens: 32 concurrent 300-token streams preempt."""
    from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # nice 10: the observers under test get their CPU, as beside a GPU server (docs/testing.md)
    with LocalVLLM(ServerConfig(model=tiny_model, nice=10), log_path=log) as server:
        yield server


@pytest.fixture
def data_dir() -> Path:
    return DATA
