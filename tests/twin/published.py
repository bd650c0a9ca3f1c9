"""Published vLLM step times the twin's step model is held to (docs/twin.md's table).

Each entry is what a public benchmark measured, how it maps onto one engine step, and whether
the step model's constants were fitted to it (a fit point) or it is held out. Sources:
- Lambda, "LLMs inference benchmarks, using vLLM, on Lambda Cloud" (github.com/LambdaLabsML/
  vllm-benchmark, results/prompt_10/, 2024-09): Meta-Llama-3-8B-Instruct bf16, vLLM 0.6.0 with
  10-step scheduling, ten ShareGPT prompts at once (1,369 prompt tokens). A streamed chunk
  carries ten steps, so the median inter-token latency / 10 is one decode step of up to ten
  sequences; the time to first token is one prefill of all ten prompts.
- J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100" (johnmusgrave.com): Llama 3.1 8B
  bf16, vLLM 0.23, one request of 1,024 + 128 tokens: 75 tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.timing.steptime import ScheduledRequest

__all__ = ["PublishedStep", "PUBLISHED", "LAMBDA_PROMPTS"]

# Lambda's ten ShareGPT prompts (input_lens in their result files)
LAMBDA_PROMPTS = (13, 25, 27, 10, 329, 29, 399, 328, 4, 205)


@dataclass(frozen=True)
class PublishedStep:
    name: str
    model: str
    gpu: str
    seconds: float  # the published step time
    batch: tuple[ScheduledRequest, ...]  # the step as the twin models it
    fitted: bool  # the constants were fitted to it
    source: str


PUBLISHED = (
    PublishedStep(
        "decode, 10 sequences", "llama-3.1-8b", "h100", 0.0072,
        tuple(ScheduledRequest(1, n + 150) for n in LAMBDA_PROMPTS), True,
        "Lambda 1xH100-80GB-SXM, median ITL 72.3 ms / 10 steps",
    ),
    PublishedStep(
        "decode, 10 sequences", "llama-3.1-8b", "a100", 0.01145,
        tuple(ScheduledRequest(1, n + 150) for n in LAMBDA_PROMPTS), False,
        "Lambda 1xA100-80GB-SXM, median ITL 114.9 ms / 10 steps",
    ),
    PublishedStep(
        "decode, 1 sequence", "llama-3.1-8b", "a100-40gb", 1 / 75,
        (ScheduledRequest(1, 1024 + 64),), False,
        "Musgrave, A100 40GB, 75 tokens/s at concurrency 1",
    ),
    PublishedStep(
        "prefill of 10 prompts, 1,369 tokens", "llama-3.1-8b", "h100", 0.0622,
        tuple(ScheduledRequest(n, n) for n in LAMBDA_PROMPTS), True,
        "Lambda 1xH100-80GB-SXM, median TTFT 62.2 ms",
    ),
    PublishedStep(
        "prefill of 10 prompts, 1,369 tokens", "llama-3.1-8b", "a100", 0.1267,
        tuple(ScheduledRequest(n, n) for n in LAMBDA_PROMPTS), True,
        "Lambda 1xA100-80GB-SXM, median TTFT 126.7 ms",
    ),
)  # fmt: skip
