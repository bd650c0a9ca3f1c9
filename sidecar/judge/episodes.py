"""Thrashing episodes, tracked per engine (pure: sidecar/store/episode_store.py keeps them in SQLite
so they survive a sidecar restart).

An episode opens when an engine enters `thrashing` and closes when it leaves. Per episode:
start and end, peak KV usage, preemptions and repeat preemptions in it, and estimates of the work
redone: tokens recomputed (each preemption recomputes the victim's context, estimated as the
average context of a running request, KV tokens in use / running) and the time that takes at the
best prompt throughput seen (a rough figure: prefill speed is not measured directly).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.sidecar.judge.signals import EngineSignals

__all__ = ["Episode", "EpisodeTracker"]


@dataclass
class Episode:
    target: str
    model_name: str
    engine: str
    start_unix: float
    end_unix: float | None = None
    peak_kv: float = 0.0
    preemptions: float = 0.0
    repeat_preempted: float = 0.0
    tokens_recomputed: float = 0.0
    recompute_s_estimate: float | None = None
    closed_by: str | None = None  # "recovered" or "sidecar restart"
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EpisodeTracker:
    """Follows one engine; returns the episode whenever it opens, grows or closes."""

    def __init__(self, target: str, model_name: str, engine: str) -> None:
        self.key = (target, model_name, engine)
        self.current: Episode | None = None
        self._peak_prefill = 0.0

    def tick(
        self,
        now_unix: float,
        thrashing: bool,
        sig: EngineSignals,
        d_preempt: float,
        d_repeat: float,
    ) -> Episode | None:
        self._peak_prefill = max(self._peak_prefill, sig.prompt_tokens_per_s or 0.0)
        ep = self.current
        if ep is None and not thrashing:
            return None
        if ep is None:
            ep = self.current = Episode(*self.key, start_unix=now_unix)
        ep.peak_kv = max(ep.peak_kv, sig.kv_usage or 0.0)
        ep.preemptions += d_preempt
        ep.repeat_preempted += d_repeat
        if d_preempt and sig.kv_usage is not None and sig.capacity_tokens:
            context = sig.kv_usage * sig.capacity_tokens / max(sig.running or 1.0, 1.0)
            ep.tokens_recomputed += d_preempt * context
        if self._peak_prefill > 0:
            ep.recompute_s_estimate = ep.tokens_recomputed / self._peak_prefill
        if not thrashing:
            ep.end_unix, ep.closed_by = now_unix, "recovered"
            self.current = None
        return ep
