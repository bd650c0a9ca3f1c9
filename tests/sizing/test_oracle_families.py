"""The families added with the registry sweep, against vLLM's own planner (engine start, dummy
weights: tests/sizing/oracle.py), both ways: kvwatch's arithmetic and vLLM's layer specs.

The sweep (test_arch_sweep.py) holds each family's layers to vLLM's; this holds the blocks,
tokens and the capacity line those layers give. Two families a day in CI (about 20 s), all
seven with KVWATCH_ORACLE_ALL=1 (about 85 s here; all equal at commit, docs/sizing.md).
Gemma 4 has no arithmetic: its vLLM path alone is checked, and the arithmetic must refuse it.
"""

from __future__ import annotations

import datetime
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvwatch.sizing.archconfig import read_config
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import architecture_for
from kvwatch.sizing.kvplan import PLATFORMS, Serving, capacity_line, plan
from tests.sizing.oracle import OracleResult, run_oracle
from tests.sizing.test_oracle import ARCH, MIB, _this_cpu

pytestmark = pytest.mark.integration

FAMILIES = ["falcon", "jamba", "lfm2", "falconh1", "zamba2", "gemma3n", "gemma4"]
VLLM_ONLY = {"gemma4"}
SETTINGS = dict(kv_cache_memory_bytes=10 * MIB, max_model_len=1024, max_num_batched_tokens=512)


def _today() -> list[str]:
    if os.environ.get("KVWATCH_ORACLE_ALL"):
        return FAMILIES
    day = datetime.date.today().toordinal()
    return [FAMILIES[day % len(FAMILIES)], FAMILIES[(day + 3) % len(FAMILIES)]]


@pytest.fixture(scope="module")
def oracle() -> dict[str, OracleResult]:
    names = _today()
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = list(pool.map(lambda n: run_oracle(ARCH / n, SETTINGS), names))
    return dict(zip(names, found, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("source", ["kvwatch", "vllm"])
def test_the_family_plans_as_vllm(
    family: str, source: str, oracle: dict[str, OracleResult]
) -> None:
    if family not in oracle:
        pytest.skip("not in today's two (KVWATCH_ORACLE_ALL=1 runs all)")
    truth = oracle[family]
    assert truth.error is None, truth.error
    if source == "kvwatch" and family in VLLM_ONLY:
        with pytest.raises(SizingError, match="not an architecture"):
            architecture_for(read_config(ARCH / family), family, source)
        return
    arch = architecture_for(read_config(ARCH / family), family, source)
    mine = plan(arch, Serving(1024, max_num_batched_tokens=512), PLATFORMS[_this_cpu()],
                10 * MIB)  # fmt: skip
    assert (mine.num_gpu_blocks, mine.layout.block_size, mine.kv_cache_size_tokens) == (
        truth.num_gpu_blocks, truth.block_size, truth.kv_cache_size_tokens,
    )  # fmt: skip
    assert truth.capacity_line is not None and capacity_line(mine, "CPU") == truth.capacity_line
