"""What the step model predicts for a figure benchmarks measure, so it can be held to one.

Benchmarks of vLLM publish whole-load figures, not steps. Each is mapped onto steps of the step
model (`steptime.py`) the way vLLM schedules that load:

- **closed batch** (`vllm bench latency`: B prompts of P tokens at once, O tokens each; the time
  from the first prompt to the last token): the prompts' prefill in steps of at most
  `max_num_batched_tokens`, then O - 1 decode steps of B requests, read at contexts from P to
  P + O; a batch larger than what runs at once (`max_num_seqs`, or what the KV cache holds)
  runs at that many for B / that many of a batch's time, as vLLM starts a waiting prompt each
  time one finishes;
- **fixed concurrency** (`vllm bench serve --max-concurrency C`, a closed loop): the steady
  state of C streams (`loadmodel.py`); TPOT is a stream's cycle less its own time to first token
  over O - 1 gaps (the others' prefills land inside its decode and count), output tokens/s is
  C x O over the cycle; streams that drifted apart (a measured run says so) send in smaller
  waves, each prefilled beside the others' decodes;
- **step** (a simulator's or paper's per-step time): one step of B requests at context L;
- **busy span** (a server's counters over a span in which it was busy, `kvwatch calibrate
  --metrics/--sidecar/--prometheus`, `server_slices.py`): its mean step, from the span's own
  mix (the steps it took, the tokens they produced, the prompt tokens it computed and how
  many prompts), not from a steady state: a closed loop's prompts come in waves, and a span
  of a few seconds holds a wave's decodes or its prefills, not the mean of both. The span's
  steps produce `generated / steps` tokens each (the mean batch); the prompts are computed in
  as few steps as the token budget allows beside that batch, the other steps are decodes.
  Step times are near linear in the batch and in the prompt tokens, so a span pooled from
  slices is predicted from its totals. vLLM counts a step only when it produced a token
  (`IterationStats` only with outputs, v1/engine/async_llm.py): a step of prompt chunks alone
  is not in the count, its time is in the span, and the prefill term carries it.

Pure arithmetic; the corpus bench and `kvwatch calibrate` both predict through here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvwatch.sizing.errors import SizingError
from kvwatch.timing.loadmodel import decode_step_s, steady_loop
from kvwatch.timing.steptime import ScheduledRequest, StepModel

__all__ = ["Load", "METRICS", "predict"]

LoadKind = Literal["closed_batch", "fixed_concurrency", "step", "busy_span"]
# seconds, except tokens/s; TPOT and ITL are one quantity here (a stream's mean gap)
METRICS = ("tpot_s", "e2e_s", "ttft_s", "output_tok_s", "step_s")


@dataclass(frozen=True)
class Load:
    """A measured load: what was sent, and with which engine limits."""

    kind: LoadKind
    concurrency: int  # the batch of a closed batch; streams of a fixed concurrency
    input_len: int  # a step's context for kind "step"
    output_len: int  # a step's new tokens per request for kind "step"
    batched_tokens: int  # vLLM's max_num_batched_tokens
    max_num_seqs: int
    # a fixed concurrency's streams that send together (0: all, as streams started together
    # stay in step); a measured run says where its streams drifted apart
    wave: int = 0
    # a busy span's own mix (kind "busy_span"): the engine steps in it, the tokens they
    # produced (first tokens included), the prompt tokens computed (cache hits not), prompts
    steps: int = 0
    generated: int = 0
    prefill_tokens: int = 0
    prefills: int = 0

    def __post_init__(self) -> None:
        if min(self.concurrency, self.input_len, self.output_len) < 1:
            raise SizingError("a measured load needs concurrency and lengths of at least 1")
        if min(self.steps, self.generated, self.prefill_tokens, self.prefills) < 0:
            raise SizingError("a span's steps and tokens cannot be negative")
        if self.kind == "busy_span" and (self.steps < 1 or self.generated < 1):
            raise SizingError("a busy span needs a step and a generated token at least")
        if self.batched_tokens < 1 or self.max_num_seqs < 1:
            raise SizingError("max_num_batched_tokens and max_num_seqs must be at least 1")
        if self.wave < 0:
            raise SizingError("a wave of streams cannot be negative")


def predict(steps: StepModel, load: Load, metric: str) -> float:
    """The step model's figure for `metric` under `load` (seconds, or tokens/s)."""
    if metric not in METRICS:
        raise SizingError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    c, p, o = load.concurrency, load.input_len, load.output_len
    if load.kind in ("step", "busy_span"):
        if metric != "step_s":
            raise SizingError(f"a {load.kind.replace('_', ' ')} is measured as step_s")
        if load.kind == "busy_span":
            return _span_step_s(steps, load)
        return steps.seconds([ScheduledRequest(o, p + o)] * c)
    if load.kind == "closed_batch":
        running = min(c, load.max_num_seqs)
        prefill = _closed_prefill_s(steps, running, p, load.batched_tokens)
        decode = decode_step_s(steps, running, p, o)
        e2e = prefill + (o - 1) * decode
        waves = c / running
        values = {
            "e2e_s": e2e * waves,
            "ttft_s": prefill,
            "tpot_s": decode,
            "output_tok_s": c * o / (e2e * waves),
        }
        if metric == "step_s":
            raise SizingError("a closed batch is measured as e2e_s, ttft_s, tpot_s or tokens/s")
        return values[metric]
    loop = steady_loop(steps, c, p, o, load.batched_tokens, load.max_num_seqs, wave=load.wave)
    values = {
        "e2e_s": loop.cycle_s,
        "ttft_s": loop.ttft_s,
        "tpot_s": loop.tpot_s,
        "output_tok_s": loop.output_tokens_per_s,
    }
    if metric == "step_s":
        raise SizingError("a fixed concurrency is measured as tpot_s, e2e_s, ttft_s or tokens/s")
    return values[metric]


def _span_step_s(steps: StepModel, load: Load) -> float:
    """A busy span's mean step (see the module's docstring)."""
    n, p, o = load.generated / load.steps, load.input_len, load.output_len
    lo = max(1, math.floor(n))  # the mean batch between two whole batches
    frac = max(0.0, n - lo)
    decode = decode_step_s(steps, lo, p, o)
    if frac > 0:
        decode += frac * (decode_step_s(steps, lo + 1, p, o) - decode)
    if load.prefill_tokens == 0:
        return decode
    prefill_steps = min(
        load.steps, max(1, math.ceil(load.prefill_tokens / max(1.0, load.batched_tokens - n)))
    )
    per_step = math.ceil(max(1, load.prefills) / prefill_steps)  # prompts a prefill step holds
    chunk = max(1, round(load.prefill_tokens / (prefill_steps * per_step)))
    beside = max(0, round(n) - per_step)  # the batch's other requests decode in it
    # a prompt's chunk reads what was computed before it (a cached prefix, earlier chunks)
    batch = [ScheduledRequest(chunk, max(chunk, p))] * per_step
    batch += [ScheduledRequest(1, p + o // 2)] * beside
    prefill = steps.seconds(batch)
    return (prefill_steps * prefill + (load.steps - prefill_steps) * decode) / load.steps


def _closed_prefill_s(steps: StepModel, running: int, p: int, budget: int) -> float:
    """All prompts at once, chunked by the token budget, no decodes beside them."""
    total = running * p
    n = max(1, math.ceil(total / budget))
    if p <= budget:
        return n * steps.seconds([ScheduledRequest(p, p)] * math.ceil(running / n))
    chunks = math.ceil(p / budget)  # one long prompt a few steps at a time
    return running * chunks * steps.seconds([ScheduledRequest(min(p, budget), p)])
