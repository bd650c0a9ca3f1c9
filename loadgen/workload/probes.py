"""Bystander probes: small requests at a fixed rate, on connections of their own, reported apart
from the load. A load's own latencies say what its requests saw; the probes say what the load
does to everyone else on the server (a short chat turn arriving mid-run), as
`vllm bench serve --probe-request-rate` reports them.

`--probe-rate 2 --probe-input-len 64 --probe-output-len 16`: two probes a second through every
stage, warm-up included (those are left out of the summary as the warm-up's requests are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvwatch.loadgen.workload.lengths import DatasetError

__all__ = ["ProbeSpec", "PROBE_SEED_OFFSET"]

# Probes draw their prompts from the run's corpus with a seed of their own (adding probes leaves
# the load unchanged), reversed so that they share no prefix with the load's (workload.py).
PROBE_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class ProbeSpec:
    """The probe stream: `rate` requests per second of `input_tokens` in, `output_tokens` out."""

    rate: float
    input_tokens: int = 64
    output_tokens: int = 16

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise DatasetError(f"--probe-rate must be a positive number, not {self.rate:g}")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise DatasetError("--probe-input-len and --probe-output-len must be at least 1")

    @property
    def interval_s(self) -> float:
        return 1.0 / self.rate

    def describe(self) -> dict[str, float | int]:
        return {"rate": self.rate, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens}  # fmt: skip
