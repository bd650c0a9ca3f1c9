"""What a closed loop of streams does to a vLLM server: where preemption starts, and its tokens/s.

The load is C streams, each sending a prompt of P tokens for O output tokens and the next one as
soon as the last answer ends (what `kvwatch loadgen run --concurrency`, `vllm bench serve
--max-concurrency` and most load tools do). Started together, the streams stay in step: each
wave's prompts are prefilled in the first steps and all of them decode side by side, so:

- **Onset.** A request holds `blocks_per_request(P + O - 1)` blocks at its last step (vLLM does
  not schedule a token past `max_tokens`, `Scheduler.schedule`), and every stream reaches its
  last step within one wave's prefill of the others. vLLM admits a prompt while its blocks are
  free and preempts only when a running request cannot get its next block, so C streams run
  clean while `C x blocks_at_end` fits the pool less its one null block, and the KV onset is
  the next C. A window group (sliding or chunked attention) holds more while a prompt is
  prefilled than once it decodes; that peak makes prompts wait for room, not preempt.
- **Tokens/s.** One stream's cycle is O + 1 engine steps (its prefill step makes the first
  token; under async scheduling its next prompt arrives while the following step is already
  planned). Of those steps, the wave's prefills take `ceil(C x P / (max_num_batched_tokens -
  C))` (the decodes share the budget), each with the other streams decoding in it; the rest
  are decode steps of C requests, read at contexts from P to P + O. Step times are the twin's
  step model (`timing/steptime.py`), so on the twin the figure tests the scheduling arithmetic;
  on a card it is as good as the step model's calibration (docs/twin.md). Streams that drifted
  apart (a measured run says so, `advise/calibrate.py`) send in waves of w: C / w waves a
  cycle, each prefilled beside the other streams' decodes.

Pure arithmetic; preemption's own cost (recompute) is outside it: past the onset the figure is
what the load would get with room, and the text says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvplan import KvLayout
from kvwatch.timing.steptime import ScheduledRequest, StepModel

__all__ = [
    "ClosedLoop",
    "LoadPrediction",
    "Throughput",
    "predict_closed_loop",
    "steady_loop",
    "decode_step_s",
]

_CONTEXT_SAMPLES = 8  # decode steps are read at this many points of a wave's progress


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int
    prompt_len: int
    output_len: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise SizingError("the concurrency must be at least 1")
        if self.prompt_len < 1 or self.output_len < 1:
            raise SizingError("prompt and output lengths must be at least 1 token")


@dataclass(frozen=True)
class Throughput:
    """The steady state of C streams; seconds are the card's (a twin's: simulated)."""

    concurrency: int
    running: int  # at most max_num_seqs run; the rest wait
    prefill_steps: int  # per wave
    prefill_step_s: float
    decode_step_s: float  # mean over a wave
    cycle_steps: int
    cycle_s: float
    output_tokens_per_s: float
    preempts: bool  # past the onset: the figure is what the load would get with room
    ttft_s: float  # mean over the wave's streams: their prompts' prefill steps
    tpot_s: float  # a stream's cycle less its TTFT over its O - 1 gaps (others' prefills count)


@dataclass(frozen=True)
class LoadPrediction:
    load: ClosedLoop
    num_gpu_blocks: int
    block_size: int
    blocks_at_end: int  # what one request holds at its last step
    blocks_in_prefill: int  # what one request holds while its prompt is prefilled
    fits_concurrency: int  # the most streams that run without preemption
    kv_onset_concurrency: int | None  # the lowest concurrency that preempts; None: never
    max_num_seqs: int
    at_concurrency: Throughput | None  # None: no step model for this device
    at_fits: Throughput | None  # at fits_concurrency
    arithmetic: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_step_s(steps: StepModel, running: int, p: int, o: int) -> float:
    """The mean decode step of `running` requests whose contexts grow from P to P + O."""
    contexts = [p + (2 * i + 1) * o // (2 * _CONTEXT_SAMPLES) for i in range(_CONTEXT_SAMPLES)]
    samples = [steps.seconds([ScheduledRequest(1, ctx)] * running) for ctx in contexts]
    return sum(samples) / len(samples)


def steady_loop(
    steps: StepModel,
    c: int,
    p: int,
    o: int,
    batched_tokens: int,
    max_num_seqs: int,
    onset: int | None = None,
    wave: int = 0,
) -> Throughput:
    """The steady state of C streams; `onset`: the KV onset, past which the figure is what
    the load would get with room. `wave`: how many streams send together (0: all of them,
    as streams started together stay); streams that drifted apart send in waves of a few,
    each prefilled beside the others' decodes, and a cycle holds C / wave such waves."""
    running = min(c, max_num_seqs)
    waves = math.ceil(running / min(running, wave)) if wave > 0 else 1
    w = math.ceil(running / waves)  # the cycle's prompts shared evenly: 32 in waves of 28 -> 16
    # decodes share the token budget with the prompts
    prefill_steps = max(1, math.ceil(w * p / max(1, batched_tokens - running)))
    if waves * prefill_steps > o + 1:  # more waves than a cycle has steps: they merge
        waves = max(1, (o + 1) // prefill_steps)
        w = math.ceil(running / waves)
        prefill_steps = max(1, math.ceil(w * p / max(1, batched_tokens - running)))
    cycle_steps = max(o + 1, waves * prefill_steps)
    per_step = math.ceil(w / prefill_steps)  # prompts begun in one prefill step
    chunk = min(p, max(1, batched_tokens // per_step))
    mid = p + o // 2
    prefill_batch = [ScheduledRequest(chunk, chunk)] * per_step + [ScheduledRequest(1, mid)] * (
        running - per_step
    )
    prefill_s = steps.seconds(prefill_batch)
    decode_s = decode_step_s(steps, running, p, o)
    cycle_s = waves * prefill_steps * prefill_s + (cycle_steps - waves * prefill_steps) * decode_s
    # in step, the prompts begun in the wave's i-th prefill step see their first token when it
    # ends: the mean over the wave is (n + 1) / 2 of its n prefill steps
    ttft = prefill_s * (prefill_steps + 1) / 2
    return Throughput(
        concurrency=c,
        running=running,
        prefill_steps=prefill_steps,
        prefill_step_s=prefill_s,
        decode_step_s=decode_s,
        cycle_steps=cycle_steps,
        cycle_s=cycle_s,
        output_tokens_per_s=running * o / cycle_s,
        preempts=onset is not None and c >= onset,
        ttft_s=ttft,
        tpot_s=max(decode_s, (cycle_s - ttft) / max(1, o - 1)),
    )


def _prefill_blocks(layout: KvLayout, prompt_len: int, batched_tokens: int) -> int:
    """Blocks a request holds while its prompt's last chunk is computed: a full-attention group
    its whole prompt; a window group what the chunk writes beside the window before it (freed
    on the request's next step, `remove_skipped_blocks`)."""
    chunk = min(prompt_len, batched_tokens)
    start = prompt_len - chunk  # computed before the last chunk
    out = 0
    for g in layout.groups:
        allocated = math.ceil(prompt_len / g.block_size)
        if g.kind == "sliding" and g.window:
            out += allocated - max(0, start - g.window + 1) // g.block_size
        elif g.kind == "chunked" and g.window:
            out += allocated - start // g.window * g.window // g.block_size
        else:
            out += g.held(prompt_len)
    return out


def predict_closed_loop(
    load: ClosedLoop,
    layout: KvLayout,
    num_gpu_blocks: int,
    batched_tokens: int,
    max_num_seqs: int,
    steps: StepModel | None,
) -> LoadPrediction:
    p, o, c = load.prompt_len, load.output_len, load.concurrency
    at_end = layout.blocks_per_request(p + o - 1)
    in_prefill = _prefill_blocks(layout, p, batched_tokens)
    usable = num_gpu_blocks - 1  # the block pool keeps one null block (BlockPool.null_block)
    # a window group's prefill peak makes a prompt wait for room, it preempts no one: vLLM
    # admits a prompt only while its blocks are free (bench/bench_whatif_load.py: gpt-oss-120b
    # ran 161 streams clean where counting the peak said 158)
    fits = usable // max(at_end, 1) if in_prefill <= usable else 0
    onset = fits + 1 if fits + 1 <= max_num_seqs else None
    arithmetic = [
        f"one request holds {at_end:,} blocks at its last step ({p + o - 1:,} tokens)"
        + (f" and {in_prefill:,} while its prompt is prefilled" if in_prefill != at_end else ""),
        f"{usable:,} usable blocks // {at_end:,} = {fits:,} streams run without preemption",
        f"KV onset: {fits + 1:,} streams"
        if onset is not None
        else f"no onset: vLLM runs at most {max_num_seqs:,} sequences (--max-num-seqs)",
    ]
    at_c = at_fits = None
    if steps is not None:
        at_c = steady_loop(steps, c, p, o, batched_tokens, max_num_seqs, onset)
        if fits >= 1:
            at_fits = steady_loop(steps, fits, p, o, batched_tokens, max_num_seqs, onset)
        arithmetic.append(
            f"{c:,} streams: {at_c.prefill_steps} prefill steps of {at_c.prefill_step_s * 1e3:,.1f}"
            f" ms + {at_c.cycle_steps - at_c.prefill_steps:,} decode steps of "
            f"{at_c.decode_step_s * 1e3:,.1f} ms a wave = {at_c.cycle_s:,.2f} s; "
            f"{at_c.running:,} x {o:,} tokens / {at_c.cycle_s:,.2f} s = "
            f"{at_c.output_tokens_per_s:,.0f} output tokens/s"
        )
    return LoadPrediction(
        load=load,
        num_gpu_blocks=num_gpu_blocks,
        block_size=layout.block_size,
        blocks_at_end=at_end,
        blocks_in_prefill=in_prefill,
        fits_concurrency=fits,
        kv_onset_concurrency=onset,
        max_num_seqs=max_num_seqs,
        at_concurrency=at_c,
        at_fits=at_fits,
        arithmetic=tuple(arithmetic),
    )
