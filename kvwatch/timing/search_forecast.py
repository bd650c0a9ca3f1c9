"""What a capacity search should find, said before it probes: the KV onset and the highest
closed-loop concurrency whose predicted figures meet the SLO limits.

`kvwatch loadgen search --calibration FILE` asks this with the server's own cache (its blocks
and block size, read from /metrics) and the calibrated step model, starts its bracket just below
the forecast, and prints the forecast beside what the probes found. The figures are the closed
loop's means (`loadmodel.steady_loop`); the search judges every request against each limit, so
a forecast's limit is where the mean crosses it, an upper bound where the tail matters. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.sizing.kvplan import KvLayout
from kvwatch.timing.loadmodel import ClosedLoop, predict_closed_loop, steady_loop
from kvwatch.timing.steptime import StepModel

__all__ = ["SearchForecast", "forecast_search", "FORECAST_METRICS"]

# the SLO metrics a closed loop's model predicts; the others (from the time a request was
# scheduled) are the server's and cannot be forecast from steps alone
FORECAST_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class SearchForecast:
    kv_onset: int | None  # the lowest concurrency that preempts; None: not up to max_load
    # the highest concurrency meeting every forecastable limit, below the onset
    slo_limit: int | None
    binding: str  # "kv", "compute" or "none" (neither up to max_load)
    at_limit: dict[str, float]  # the figures at slo_limit (seconds; output tokens/s)
    unforecast: list[str] = field(default_factory=list)  # SLO metrics it cannot predict

    def to_dict(self) -> dict[str, object]:
        return {
            "kv_onset": self.kv_onset,
            "slo_limit": self.slo_limit,
            "binding": self.binding,
            "at_limit": self.at_limit,
            "unforecast": self.unforecast,
        }


def forecast_search(
    steps: StepModel,
    layout: KvLayout,
    num_gpu_blocks: int,
    batched_tokens: int,
    max_num_seqs: int,
    prompt_len: int,
    output_len: int,
    slo: dict[str, float],
    max_load: int,
) -> SearchForecast:
    """The onset and the SLO limit of closed loops of 1 to `max_load` streams. Past the onset
    the loop model gives what the load would get with room, not the cost of its preemptions,
    so the forecast stops there: with binding "kv" the limit is the last clean load, and the
    search may find SLOs still met past it (it reports the onset and the limit apart)."""
    onset = predict_closed_loop(
        ClosedLoop(1, prompt_len, output_len), layout, num_gpu_blocks, batched_tokens,
        max_num_seqs, None,
    ).kv_onset_concurrency  # fmt: skip
    limit = None
    at_limit: dict[str, float] = {}
    last = max(1, max_load) if onset is None else min(max(1, max_load), onset - 1)
    for c in range(1, last + 1):
        x = steady_loop(steps, c, prompt_len, output_len, batched_tokens, max_num_seqs, onset)
        figures = {"ttft": x.ttft_s, "tpot": x.tpot_s, "e2e": x.cycle_s}
        if any(figures[k] > v for k, v in slo.items() if k in figures):
            break
        limit = c
        at_limit = {**figures, "output_tok_s": x.output_tokens_per_s}
    if onset is not None and onset > max_load:
        onset = None
    if limit is None:
        binding = "compute"
    elif limit == max_load:
        binding = "none"
    elif onset is not None and limit + 1 >= onset:
        binding = "kv"
    else:
        binding = "compute"
    return SearchForecast(
        onset, limit, binding, at_limit, sorted(k for k in slo if k not in FORECAST_METRICS)
    )
