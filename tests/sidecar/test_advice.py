from __future__ import annotations

import pytest

from kvwatch.sidecar.advice import Observed, advise
from kvwatch.sidecar.kvmath import SizingError, lookup_gpu


def obs(**kw: float) -> Observed:
    base = dict(
        capacity_blocks=40,
        block_size=32,
        kv_bytes_per_token=8192,
        peak_demand=32,
        seq_len_p95=330,
        seq_len_max=330,
        preemptions=85,
    )
    base.update(kw)
    return Observed(**base)  # type: ignore[arg-type]


class TestAdvise:
    def test_fixture_thrash_hand_computed(self) -> None:
        a = advise(obs())
        # 330 tokens = 11 blocks; 39 usable; floor(39 x 0.9 / 11) = 3
        assert a.max_num_seqs == 3
        # 32 x 11 = 352 blocks; ceil(352 / 0.9) + 1 = 393 blocks of 256 KiB
        assert a.blocks_needed == 393 and a.kv_cache_memory_bytes == 393 * 32 * 8192
        assert "undersized" in a.verdict
        assert any(o.startswith("--kv-cache-memory-bytes 103022592") for o in a.options)
        assert not a.fp8_suffices  # 78 usable blocks at fp8 < 352

    def test_fits(self) -> None:
        a = advise(obs(peak_demand=3))
        assert a.verdict.startswith("fits") and a.options == []

    def test_fp8_when_it_suffices(self) -> None:
        a = advise(obs(peak_demand=5))  # 55 blocks: over 35.1, under 70.2
        assert a.fp8_suffices and any("fp8" in o for o in a.options)

    def test_utilization_only_ever_raised(self) -> None:
        gpu = lookup_gpu("h100")
        o = obs(
            capacity_blocks=1000,
            block_size=16,
            kv_bytes_per_token=131072,
            peak_demand=100,
            seq_len_p95=1500,
            seq_len_max=1500,
            gpu_memory_utilization=0.9,
            kv_cache_memory_bytes=1000 * 16 * 131072,
        )
        a = advise(o, gpu=gpu)
        assert a.gpu_memory_utilization is None or a.gpu_memory_utilization > 0.9
        assert not any("--gpu-memory-utilization 0.8" in x for x in a.options)

    def test_bad_figures(self) -> None:
        with pytest.raises(SizingError, match="seq_len_p95 must not be negative"):
            obs(seq_len_p95=-1)
        with pytest.raises(SizingError, match="capacity_blocks must be positive"):
            obs(capacity_blocks=0)
        with pytest.raises(SizingError, match="margin"):
            advise(obs(), margin=1.5)
