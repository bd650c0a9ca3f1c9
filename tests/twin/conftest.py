"""One twin per test session for the tests that need one: Llama 3.1 8B on a simulated H100 with
8,000 KV blocks of 16 (the seed's scenario outgrows them), time scale 2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

TWIN_BLOCKS = 8000
TWIN_TIME_SCALE = 2.0


@pytest.fixture(scope="session")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from kvwatch.twin.serve import start_twin

    tmp = tmp_path_factory.mktemp("twin")
    with start_twin(
        "llama-3.1-8b",
        "h100",
        tmp / "vllm.log",
        time_scale=TWIN_TIME_SCALE,
        vllm_args=(
            "--max-model-len",
            "4096",
            "--kv-cache-memory-bytes",
            str(TWIN_BLOCKS * 16 * 131072),
            "--enable-per-request-metrics",  # vLLM's own timings beside the client's
        ),  # fmt: skip
        status_dir=tmp,
        status_interval_s=0.25,
    ) as server:  # stopped on the way out, as the benches stop theirs
        yield server


@pytest.fixture(scope="session")
def twin_log(twin: object) -> Path:
    from kvwatch.twin.serve import TwinServer

    assert isinstance(twin, TwinServer)
    return twin.server.log_path
