"""Advice for stalls a bigger cache would not remove: prefill interference.

vLLM runs every running request in every step, and with chunked prefill a step also computes
up to `--max-num-batched-tokens` tokens of new prompts; such a step holds every stream for its
whole length. When most of a run's stall time is of that kind (the load generator's
`prefill` cause, loadgen/results/stall_causes.py), the lever is the step's prompt budget: a
smaller `--max-num-batched-tokens` splits a long prompt over more steps, each short enough not
to stall the streams beside it, and the prompt's own time to first token pays for it.

The advised budget keeps a step that carries it at 80% of the stall rule's `factor x` the
decode step, rounded down to 256 tokens and no lower than `max_num_seqs` (vLLM refuses a
budget below it). The step's cost comes from one of two places:
- the step model (`prefill_advice_by_model`, with the served model and card, and a
  calibration where there is one): the decode batch the run kept running, and that batch with
  the budget's prompt tokens beside it;
- the run alone (`prefill_advice`): the decode step is the streams' median gap `g`, and a
  prefill stall's mean length `d` one step that computed `min(budget, prompt)` tokens of this
  run's mean prompt, so a prompt token costs `(d - g) / tokens`. Prompts of other clients, or
  a stall that spans several prefill steps, make that cost too high and the budget too small:
  give the model where the load is not the run's alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.timing.steptime import ScheduledRequest, StepModel

__all__ = ["PrefillAdvice", "prefill_advice", "prefill_advice_by_model"]

_SHARE = 0.5  # of the stall seconds, prefill's: the lever is worth naming
_MIN_STALLS = 3
_AIM = 0.8  # of the stall limit a step is sized to
_ROUND = 256


@dataclass(frozen=True)
class PrefillAdvice:
    stalls: float
    stall_s: float
    share: float  # of every stall second in the run
    budget_now: int
    budget_advised: int
    decode_step_s: float  # the streams' median gap
    step_now_s: float  # a prefill stall's mean length
    step_advised_s: float
    prompt_tokens: float  # the run's mean prompt
    ttft_cost_s: float  # what the mean prompt's time to first token gains
    source: str = "the run"  # where the step's cost came from

    def lines(self) -> list[str]:
        p = round(self.prompt_tokens)
        steps_now = math.ceil(p / self.budget_now)
        steps_then = math.ceil(p / self.budget_advised)
        return [
            f"prefill interference: {self.stalls:,.0f} stalls, {self.stall_s:.1f} s "
            f"({self.share:.0%} of the run's stall time) while a step prefilled new prompts",
            f"  --max-num-batched-tokens {self.budget_advised} (now {self.budget_now}): a step "
            f"then takes about {self.step_advised_s * 1e3:.0f} ms, not "
            f"{self.step_now_s * 1e3:.0f} ms, beside a decode step of "
            f"{self.decode_step_s * 1e3:.0f} ms ({self.source})",
            f"  price: a {p:,}-token prompt takes {steps_then} steps instead of {steps_now}: "
            f"about +{self.ttft_cost_s * 1e3:.0f} ms to its time to first token",
            f"  not --long-prefill-token-threshold {self.budget_advised} alone: it caps each "
            "long prompt's chunk, but a step still takes a chunk of every prompt in prefill up "
            "to the budget (on the GPU twin: stall time -11%, long prompts' TTFT +37%)",
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _worth_it(causes: dict[str, tuple[float, float]]) -> tuple[float, float, float] | None:
    """(prefill stalls, their seconds, their share) when prefill is most of the stall time."""
    n, sec = causes.get("prefill", (0.0, 0.0))
    total = sum(s for _, s in causes.values())
    if n < _MIN_STALLS or total <= 0 or sec / total < _SHARE:
        return None
    return n, sec, sec / total


def prefill_advice_by_model(
    causes: dict[str, tuple[float, float]],
    steps: StepModel,
    running: int,
    context: int,
    budget_now: int,
    prompt_tokens: float,
    max_num_seqs: int | None = None,
    factor: float = 5.0,
) -> PrefillAdvice | None:
    """`prefill_advice` with the step's cost from the step model: `running` requests of
    `context` tokens decoding, and beside them a chunk of new prompt tokens (card seconds)."""
    worth = _worth_it(causes)
    if worth is None or running < 1 or prompt_tokens <= 0:
        return None
    decode = [ScheduledRequest(1, max(1, context))] * running

    def step(prefill: int) -> float:
        return steps.seconds([*decode, ScheduledRequest(prefill, prefill)] if prefill else decode)

    g = step(0)
    limit = _AIM * factor * g
    floor = max(_ROUND, max_num_seqs or 0)
    advised = budget_now // _ROUND * _ROUND
    while advised > floor and step(min(advised, round(prompt_tokens))) > limit:
        advised -= _ROUND
    advised = max(advised, floor)
    if advised >= budget_now:
        return None
    n, sec, share = worth
    extra = math.ceil(prompt_tokens / advised) - math.ceil(prompt_tokens / budget_now)
    return PrefillAdvice(
        stalls=n, stall_s=sec, share=share, budget_now=budget_now, budget_advised=advised,
        decode_step_s=g, step_now_s=step(min(budget_now, round(prompt_tokens))),
        step_advised_s=step(min(advised, round(prompt_tokens))), prompt_tokens=prompt_tokens,
        ttft_cost_s=extra * g, source=f"step model, card seconds, {running} decoding",
    )  # fmt: skip


def prefill_advice(
    causes: dict[str, tuple[float, float]],
    decode_step_s: float | None,
    budget_now: int | None,
    prompt_tokens: float | None,
    max_num_seqs: int | None = None,
    factor: float = 5.0,
) -> PrefillAdvice | None:
    """The prompt budget that ends a run's prefill stalls, from its stalls by cause
    ({cause: (stalls, seconds)}); None when prefill is under half the stall time, when the
    figures cannot say (no budget, no gap), or when the budget is already small enough."""
    worth = _worth_it(causes)
    if worth is None:
        return None
    n, sec, share = worth
    if not decode_step_s or decode_step_s <= 0 or not budget_now or not prompt_tokens:
        return None
    step_now = sec / n
    tokens = min(budget_now, prompt_tokens)
    per_token = (step_now - decode_step_s) / tokens
    if per_token <= 0:
        return None
    room = _AIM * factor * decode_step_s - decode_step_s
    advised = int(room / per_token) // _ROUND * _ROUND
    advised = max(advised, _ROUND, max_num_seqs or 0)
    if advised >= budget_now:
        return None
    extra_steps = math.ceil(prompt_tokens / advised) - math.ceil(prompt_tokens / budget_now)
    return PrefillAdvice(
        stalls=n,
        stall_s=sec,
        share=share,
        budget_now=budget_now,
        budget_advised=advised,
        decode_step_s=decode_step_s,
        step_now_s=step_now,
        step_advised_s=decode_step_s + min(advised, prompt_tokens) * per_token,
        prompt_tokens=prompt_tokens,
        ttft_cost_s=extra_steps * decode_step_s,
    )
