"""The prompt budget advised against prefill interference (kvwatch/timing/prefill_levers.py)."""

from __future__ import annotations

import pytest

from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.prefill_levers import prefill_advice, prefill_advice_by_model
from kvwatch.timing.steptime import ScheduledRequest, StepModel

# the twin's prefill load (bench/bench_stall_causes.py): every stall a prefill
PREFILL = {"prefill": (1376.0, 2314.6), "preempted": (0.0, 0.0)}


def test_from_the_run_a_step_is_sized_under_the_stall_rule() -> None:
    """A 0.5 s stall of a 4,096-token prompt beside 20 ms decode steps: a prompt token costs
    117 us, and 80% of five decode steps leaves room for 512 of them."""
    adv = prefill_advice({"prefill": (10.0, 5.0)}, 0.02, 8192, 4096.0)
    assert adv is not None
    per_token = (0.5 - 0.02) / 4096
    assert adv.budget_advised == int((0.8 * 5 * 0.02 - 0.02) / per_token) // 256 * 256 == 512
    assert adv.step_advised_s == pytest.approx(0.02 + 512 * per_token)
    assert adv.ttft_cost_s == pytest.approx((8 - 1) * 0.02)  # 8 steps where it took 1
    text = "\n".join(adv.lines())
    assert "--max-num-batched-tokens 512 (now 8192)" in text and "+140 ms" in text


@pytest.mark.parametrize(
    ("causes", "gap", "budget", "prompt", "seqs"),
    [
        ({"prefill": (10.0, 2.0), "preempted": (10.0, 8.0)}, 0.02, 8192, 4096.0, None),  # 20%
        ({"prefill": (2.0, 1.0)}, 0.02, 8192, 4096.0, None),  # too few to say
        ({"prefill": (10.0, 5.0)}, None, 8192, 4096.0, None),  # no gap
        ({"prefill": (10.0, 5.0)}, 0.02, None, 4096.0, None),  # no budget known
        ({"prefill": (10.0, 0.1)}, 0.02, 8192, 4096.0, None),  # stalls no longer than a step
        ({"prefill": (10.0, 5.0)}, 0.02, 256, 4096.0, None),  # at the floor already
        ({"prefill": (10.0, 5.0)}, 0.02, 1024, 4096.0, 1024),  # vLLM refuses under max_num_seqs
    ],
)
def test_no_advice_where_the_figures_cannot_say_or_it_would_change_nothing(
    causes: dict, gap: float | None, budget: int | None, prompt: float, seqs: int | None
) -> None:
    assert prefill_advice(causes, gap, budget, prompt, seqs) is None


def test_from_the_step_model_the_budgets_step_stays_under_the_limit() -> None:
    steps = StepModel(resolve_model("llama-3.1-8b"), lookup_gpu("h100"))
    adv = prefill_advice_by_model(PREFILL, steps, 40, 640, 16384, 7683.0, 256)
    assert adv is not None and 256 <= adv.budget_advised < 16384
    decode = [ScheduledRequest(1, 640)] * 40
    limit = 0.8 * 5 * steps.seconds(decode)
    assert (
        steps.seconds([*decode, ScheduledRequest(adv.budget_advised, adv.budget_advised)]) <= limit
    )
    over = adv.budget_advised + 256
    assert steps.seconds([*decode, ScheduledRequest(over, over)]) > limit
    assert adv.step_now_s > adv.step_advised_s and "step model" in adv.source
    # vLLM's floor: the budget never goes under max_num_seqs
    floored = prefill_advice_by_model(PREFILL, steps, 40, 640, 16384, 7683.0, 4096)
    assert floored is not None and floored.budget_advised == 4096
