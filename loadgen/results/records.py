"""What one request saw, as the load generator records it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RequestRecord", "StallRule"]


@dataclass(frozen=True)
class StallRule:
    """A gap is a stall when it is far above that request's own typical gap.

    The client-side trace of a preemption: the victim's stream stops until it is recomputed.
    Above `factor` x the request's median gap and above `min_s` (jitter of a fast stream is none).
    """

    factor: float = 5.0
    min_s: float = 0.25

    def where(self, gaps: list[float]) -> list[int]:
        """Indices of the gaps that are stalls."""
        if len(gaps) < 3:
            return []
        limit = max(self.factor * statistics.median(gaps), self.min_s)
        return [i for i, g in enumerate(gaps) if g > limit]


@dataclass
class RequestRecord:
    """Times are seconds on the run's monotonic clock (`time.perf_counter`)."""

    request_id: str
    scheduled_at: float
    stage: str = ""
    warmup: bool = False
    expected_input_tokens: int | None = None
    expected_output_tokens: int | None = None
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    # Arrival time of every streamed chunk that carried output text, first one included.
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    session: str | None = None  # the conversation it is a turn of (sessions)
    turn: int | None = None  # 0 for a session's first
    priority: int | None = None  # the request's priority class, when it carries one
    probe: bool = False  # a bystander probe (--probe-rate), reported apart from the load
    # vLLM's own timings of the request (`--enable-per-request-metrics`), seconds: its time in
    # the waiting queue, and from first scheduled to first token (vLLM's TTFT leaves the queue out)
    server_queue_time: float | None = None
    server_ttft: float | None = None
    # the answer's token ids, where they are asked for (a session resends them); not written
    output_token_ids: list[int] | None = None
    server_id: str | None = None  # the X-Request-Id it was sent with: vLLM's id carries it

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None or self.sent_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        if self.finished_at is None or self.sent_at is None:
            return None
        return self.finished_at - self.sent_at

    @property
    def gaps(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def to_dict(self, t0: float = 0.0, stall: StallRule | None = None) -> dict[str, Any]:
        """A flat record with times relative to `t0` and the derived latencies.

        `*_from_scheduled` count from when the request was due, so a queue in the client
        (coordinated omission) shows up in them rather than hiding.
        """

        def rel(t: float | None) -> float | None:
            return None if t is None else t - t0

        gaps = self.gaps
        where = (stall or StallRule()).where(gaps)
        stalls = [gaps[i] for i in where]
        t = self.token_times
        n_out = self.output_tokens
        tpot = None
        if self.ok and n_out and n_out > 1 and self.first_token_at and self.finished_at:
            tpot = (self.finished_at - self.first_token_at) / (n_out - 1)
        due = self.scheduled_at
        return {
            "request_id": self.request_id,
            "server_id": self.server_id,
            "stage": self.stage,
            "session": self.session,
            "turn": self.turn,
            "priority": self.priority,
            "probe": self.probe,
            "warmup": self.warmup,
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "scheduled_at": rel(due),
            "sent_at": rel(self.sent_at),
            "first_token_at": rel(self.first_token_at),
            "last_token_at": rel(self.token_times[-1] if self.token_times else None),
            "finished_at": rel(self.finished_at),
            "dispatch_lag": None if self.sent_at is None else self.sent_at - due,
            "ttft": self.ttft,
            "ttft_from_scheduled": None
            if self.first_token_at is None
            else self.first_token_at - due,
            "e2e": self.e2e,
            "e2e_from_scheduled": None if self.finished_at is None else self.finished_at - due,
            "tpot": tpot,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": n_out,
            "expected_input_tokens": self.expected_input_tokens,
            "expected_output_tokens": self.expected_output_tokens,
            "server_queue_time": self.server_queue_time,
            "server_ttft": self.server_ttft,
            "chunks": len(self.token_times),
            "gaps": gaps,
            "max_gap": max(gaps, default=None),
            "stalls": len(stalls),
            "stall_time": sum(stalls),
            # [start, end] of each stall: when the stream stopped and when it resumed
            "stall_spans": [[t[i] - t0, t[i + 1] - t0] for i in where],
        }
