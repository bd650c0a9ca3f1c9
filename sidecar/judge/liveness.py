"""Is the target's engine alive? Apart from "target down": the API server may answer while its
engine is dead (`/health` fails: vLLM answers 503 once its EngineCore is gone, and keeps
answering with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1), the followed log may say it died (the API
server then exits about 5 s later: down, and the log says why), or it may be stuck (requests
run or wait, and no token is generated). Pure: the caller passes what it saw and the clock."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvwatch.sidecar.contract.thresholds import Thresholds
from kvwatch.sidecar.logs.incidents import Incident

__all__ = ["Status", "Liveness", "judge_liveness"]


class Status(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    STUCK = "stuck"


@dataclass(frozen=True)
class Liveness:
    status: Status
    reason: str
    since_unix: float | None  # when the sidecar first saw it so (None: alive)


def judge_liveness(
    up: bool | None,
    health_failing_since: float | None,
    health_detail: str,
    fatal: Incident | None,
    fatal_seen_unix: float | None,
    stalled_s: float,
    now_unix: float,
    th: Thresholds,
) -> Liveness | None:
    """None when nothing is known (never scraped, or down with nothing in the log)."""
    if fatal is not None and fatal_seen_unix is not None and (not up or health_failing_since):
        said = f"the log says: {fatal.what.value} at {fatal.started_at or '?'}: {fatal.describe()}"
        if up:
            said += f"; the API answers /metrics but /health failed ({health_detail})"
        since = min(fatal_seen_unix, health_failing_since or fatal_seen_unix)
        return Liveness(Status.DEAD, said, since)
    if not up:
        return None
    if health_failing_since is not None:
        return Liveness(
            Status.DEAD,
            f"the API answers /metrics but /health failed ({health_detail})",
            health_failing_since,
        )
    if stalled_s >= th.engine_stuck_after_s:
        return Liveness(
            Status.STUCK,
            f"requests ran or waited with no token generated for {stalled_s:.0f} s",
            now_unix - stalled_s,
        )
    return Liveness(Status.ALIVE, "", None)
