"""The closed loop's KV onset and tokens/s (timing/loadmodel.py): the arithmetic on the layouts
vLLM's planner gives (tests/twin/test_capacity.py holds those to vLLM), and the what-if's text
and JSON that carry it. The twin check is tests/twin/test_twin_live.py; the bench against
`kvwatch loadgen search` is bench/bench_whatif_load.py (docs/sizing.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.sizing.kvplan import PLATFORMS, KvPlan, Serving, plan
from kvwatch.timing.loadmodel import ClosedLoop, predict_closed_loop
from kvwatch.timing.steptime import StepModel


def _plan(model: str, gpu: str, kv_bytes: int, tp: int = 1) -> KvPlan:
    serving = Serving(
        max_model_len=4096, block_size=None, kv_dtype="auto", tp=tp, pp=1,
        max_num_batched_tokens=8192, enable_prefix_caching=True,
    )  # fmt: skip
    return plan(resolve_model(model), serving, PLATFORMS[lookup_gpu(gpu).platform], kv_bytes)


def _predict(model: str, gpu: str, kv_bytes: int, load: ClosedLoop, tp: int = 1,
             max_num_seqs: int = 1024):  # type: ignore[no-untyped-def]  # fmt: skip
    p = _plan(model, gpu, kv_bytes, tp)
    steps = StepModel(resolve_model(model), lookup_gpu(gpu), tp=tp)
    return predict_closed_loop(load, p.layout, p.num_gpu_blocks, 8192, max_num_seqs, steps)


SEED_KV = 8000 * 16 * 131072  # the seed's 8,000 blocks of Llama 3.1 8B


def test_the_seed_load_runs_clean_at_85_streams_and_preempts_at_86() -> None:
    x = _predict("llama-3.1-8b", "h100", SEED_KV, ClosedLoop(100, 1000, 500))
    # 1,499 tokens at the last step = 94 blocks; 7,999 usable (one null block) // 94 = 85
    assert (x.blocks_at_end, x.fits_concurrency, x.kv_onset_concurrency) == (94, 85, 86)
    assert x.at_concurrency is not None and x.at_concurrency.preempts
    assert x.at_fits is not None and not x.at_fits.preempts
    assert any("7,999 usable blocks // 94 = 85" in t for t in x.arithmetic)


def test_the_null_block_decides_a_pool_that_fits_exactly() -> None:
    # 94 x 85 = 7,990 blocks: a pool of 7,990 keeps 7,989 usable, so only 84 fit
    x = _predict("llama-3.1-8b", "h100", 7990 * 16 * 131072, ClosedLoop(85, 1000, 500))
    assert (x.fits_concurrency, x.kv_onset_concurrency) == (84, 85)


def test_a_window_groups_prefill_peak_makes_prompts_wait_not_preempt() -> None:
    # gpt-oss: half the layers keep a 128-token window once decoding, all 2,000 prompt
    # tokens while the prompt is computed; vLLM admits a prompt only while that fits, so the
    # onset follows the blocks at the last step (the twin ran 161 streams clean: the bench)
    x = _predict("gpt-oss-120b", "h200", 14 * 2**30, ClosedLoop(64, 2000, 400))
    assert (x.blocks_at_end, x.blocks_in_prefill) == (159, 250)
    assert x.fits_concurrency == (x.num_gpu_blocks - 1) // 159 == 160


def test_max_num_seqs_caps_the_streams_that_run() -> None:
    x = _predict("llama-3.1-8b", "h100", SEED_KV, ClosedLoop(200, 100, 50), max_num_seqs=128)
    assert x.kv_onset_concurrency is None  # 8,000 blocks hold more than 128 short requests
    assert x.at_concurrency is not None and x.at_concurrency.running == 128
    assert "no onset" in x.arithmetic[-2]


def test_tokens_per_s_is_streams_x_output_over_one_wave() -> None:
    low = _predict("llama-3.1-8b", "h100", SEED_KV, ClosedLoop(16, 1000, 500)).at_concurrency
    high = _predict("llama-3.1-8b", "h100", SEED_KV, ClosedLoop(64, 1000, 500)).at_concurrency
    assert low is not None and high is not None
    assert high.cycle_steps == 501  # 500 tokens, one step for the next prompt to arrive
    assert high.prefill_steps == 8  # 64 x 1,000 tokens over 8,192 less the 64 decodes
    cycle = high.prefill_steps * high.prefill_step_s + 493 * high.decode_step_s
    assert high.cycle_s == pytest.approx(cycle)
    assert high.output_tokens_per_s == pytest.approx(64 * 500 / cycle)
    # decode is memory-bound: four times the streams, far from four times the step time
    assert high.decode_step_s < 2 * low.decode_step_s
    assert high.output_tokens_per_s > 1.8 * low.output_tokens_per_s


def test_tp_splits_kv_heads_so_more_streams_fit() -> None:
    one = _predict("llama-3.1-70b", "h100", 18 * 2**30, ClosedLoop(64, 1500, 500), tp=4)
    two = _predict("llama-3.1-70b", "h100", 18 * 2**30, ClosedLoop(64, 1500, 500), tp=8)
    assert two.kv_onset_concurrency is not None and one.kv_onset_concurrency is not None
    assert two.kv_onset_concurrency > 1.9 * one.kv_onset_concurrency


def test_a_load_needs_a_stream_and_a_token() -> None:
    with pytest.raises(SizingError, match="concurrency"):
        ClosedLoop(0, 10, 10)
    with pytest.raises(SizingError, match="at least 1 token"):
        ClosedLoop(1, 10, 0)


def _what_if(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--what-if", "--model", "llama-3.1-8b",
         "--max-model-len", "4096", "--kv-cache-memory-bytes", str(SEED_KV),
         "--prompt-len", "1000", "--output-len", "500", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_what_if_says_the_onset_and_tokens_per_s() -> None:
    p = _what_if("--gpu", "h100", "--concurrency", "64")
    assert p.returncode == 0, p.stderr
    assert "fits: preemption would start at 86 streams (KV onset)" in p.stdout
    assert "output tokens/s at 64 streams:" in p.stdout
    assert "at 85 streams, the most that run clean:" in p.stdout
    p = _what_if("--gpu", "h100", "--concurrency", "100", "--json")
    assert p.returncode == 1, p.stderr  # undersized
    (item,) = json.loads(p.stdout)
    load = item["what_if"]["load"]
    assert load["kv_onset_concurrency"] == 86 and load["fits_concurrency"] == 85
    assert load["at_concurrency"]["preempts"] is True
    assert load["at_concurrency"]["output_tokens_per_s"] > 0
    # kept so predictions can be checked from outside (issue #40): the decode step, and the
    # cycle a wave of 100 streams takes from its first prompt to its last token
    at = load["at_concurrency"]
    assert 0 < at["decode_step_s"] < at["cycle_s"]
    assert at["cycle_s"] == pytest.approx(
        at["prefill_steps"] * at["prefill_step_s"]
        + (at["cycle_steps"] - at["prefill_steps"]) * at["decode_step_s"]
    )


def test_the_what_if_on_a_cpu_gives_the_onset_without_tokens_per_s() -> None:
    p = _what_if("--gpu", "cpu", "--concurrency", "64")
    assert p.returncode in (0, 1), p.stderr
    assert "KV onset" in p.stdout and "tokens/s not given" in p.stdout


def test_max_num_seqs_must_be_positive() -> None:
    p = _what_if("--gpu", "h100", "--concurrency", "64", "--max-num-seqs", "0")
    assert p.returncode == 2 and "--max-num-seqs: must be a whole number, at least 1" in p.stderr


def test_the_advice_names_its_price() -> None:
    """More memory: how much more per GPU than the budget the server has; TP: twice the GPUs."""
    p = _what_if("--gpu", "h100", "--concurrency", "100")
    assert p.returncode == 1, p.stderr
    assert "GiB more per GPU than the 15.62 GiB it has)" in p.stdout
    assert "--tensor-parallel-size 2 (the price: twice the GPUs;" in p.stdout


def test_a_closed_batch_past_what_runs_at_once_runs_that_many_for_its_share_of_the_time() -> None:
    """vLLM starts a waiting prompt each time one finishes: a batch of B where F run at once
    takes B / F of a batch of F's time, not whole waves (dstack's 405B runs past their cache
    read 17-76% slow as waves; docs/twin.md)."""
    from kvwatch.timing.measured import Load, predict

    steps = StepModel(resolve_model("llama-3.1-8b"), lookup_gpu("h100"))

    def e2e(batch: int) -> float:
        return predict(steps, Load("closed_batch", batch, 512, 128, 8192, 20), "e2e_s")

    assert e2e(30) == pytest.approx(1.5 * e2e(20))
    assert e2e(40) == pytest.approx(2 * e2e(20))


def test_streams_that_drifted_apart_prefill_one_wave_beside_the_others_decodes() -> None:
    """Streams started together stay in step (one wave of all, prefilled together); streams
    that drifted apart send a few at a time, each wave prefilled beside the others' decodes:
    a far shorter TTFT, and the same cycle's work in other steps (docs/twin.md)."""
    from kvwatch.timing.loadmodel import steady_loop
    from kvwatch.timing.steptime import ScheduledRequest

    steps = StepModel(resolve_model("llama-3.1-8b"), lookup_gpu("h100"))
    together = steady_loop(steps, 64, 512, 128, 8192, 1024)
    assert steady_loop(steps, 64, 512, 128, 8192, 1024, wave=64) == together
    assert together.prefill_steps == 5  # 64 x 512 over 8,192 less the 64 decodes
    apart = steady_loop(steps, 64, 512, 128, 8192, 1024, wave=1)
    alone = steps.seconds([ScheduledRequest(512, 512)] + [ScheduledRequest(1, 576)] * 63)
    assert apart.prefill_steps == 1 and apart.prefill_step_s == pytest.approx(alone)
    assert apart.ttft_s == pytest.approx(alone) and apart.ttft_s < together.ttft_s / 2
    assert apart.cycle_steps == 129  # 64 one-prompt waves fit in a cycle of 129 steps
    assert apart.cycle_s == pytest.approx(64 * alone + 65 * apart.decode_step_s)
    # more waves than a cycle has steps merge: 64 streams of 16 tokens in waves of 1 are 17
    # waves of 4, a prompt in every step of the cycle
    short = steady_loop(steps, 64, 512, 16, 8192, 1024, wave=1)
    assert short.cycle_steps == 17 and short.prefill_steps == 1
    assert short.cycle_s == pytest.approx(17 * short.prefill_step_s)
    # a cycle's prompts are its streams': 32 streams in waves of 28 are two waves of 16
    two = steady_loop(steps, 32, 512, 128, 8192, 1024, wave=28)
    assert two == steady_loop(steps, 32, 512, 128, 8192, 1024, wave=16)
    assert two.cycle_s == pytest.approx(
        2 * two.prefill_steps * two.prefill_step_s
        + (129 - 2 * two.prefill_steps) * two.decode_step_s
    )
