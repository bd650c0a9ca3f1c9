"""What one request saw, as the load generator records it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RequestRecord"]


@dataclass
class RequestRecord:
    """Times are seconds on the run's monotonic clock (`time.perf_counter`)."""

    request_id: str
    scheduled_at: float
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    # Arrival time of every streamed chunk that carried output text, first one included.
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttft=self.ttft, e2e=self.e2e)
        return d
