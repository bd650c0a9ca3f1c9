"""The twin's step trace: what each engine step carried and when the simulated card finished it.

vLLM says nothing per step that a client or /metrics could use to check a stall's cause; the
twin's worker sees every step's composition from vLLM's own scheduler output, so `kvwatch twin
--step-trace FILE` writes one JSON line per step, and the stall causes the load generator
reads from the server's counters are held to it (bench/bench_stall_causes.py). The twin writes
it; the load generator's truth reader reads it (`stall_truth.py`).

A line: `{"end": unix s, "card_s": wall s the card computed, "requests": n, "prefill": new
prompt tokens, "recompute": tokens of preempted requests computed again, "preempted": [ids],
"resumed": [ids], "skipped": [ids]}`; ids are vLLM's internal request ids
(`{the API's id}-{8 hex}`); `skipped` are requests the step before ran that this one left out
without their finishing or being preempted (a token budget spent on others).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["StepRecord", "StepTraceWriter", "read_step_trace"]

_FLUSH_S = 1.0  # a run's reader sees its steps a second after they ended at most


@dataclass(frozen=True)
class StepRecord:
    end: float  # unix seconds the card finished it
    card_s: float  # wall seconds the card computed it (its simulated time x the time scale)
    requests: int
    prefill: int  # prompt tokens computed for the first time
    recompute: int  # tokens of preempted requests computed again
    preempted: tuple[str, ...] = ()  # preempted when this step was scheduled
    resumed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {"end": round(self.end, 6), "card_s": round(self.card_s, 7),
             "requests": self.requests, "prefill": self.prefill, "recompute": self.recompute,
             "preempted": list(self.preempted), "resumed": list(self.resumed),
             "skipped": list(self.skipped)},
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        """Raises ValueError saying what is wrong with the line."""
        raw: Any = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        out: dict[str, Any] = {}
        for k in ("end", "card_s"):
            v = raw.get(k)
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"{k} is not a number")
            if v < 0:
                raise ValueError(f"{k} is negative")
            out[k] = float(v)
        for k in ("requests", "prefill", "recompute"):
            v = raw.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{k} is not a count")
            out[k] = v
        for k in ("preempted", "resumed", "skipped"):
            v = raw.get(k, [])
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{k} is not a list of ids")
            out[k] = tuple(v)
        return cls(**out)


class StepTraceWriter:
    """Appends steps to a file, flushed at most a second apart and on close: the engine's
    step loop does no more I/O than a buffered write."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        self._flushed = time.monotonic()
        self.error: str | None = None  # why it stopped writing (a full disk): the engine goes on

    def write(self, step: StepRecord) -> bool:
        """False once writing has failed; the trace then ends there and `error` says why."""
        if self._file is None:
            return self.error is None
        try:
            self._file.write(step.to_json() + "\n")
            now = time.monotonic()
            if now - self._flushed >= _FLUSH_S:
                self._file.flush()
                self._flushed = now
        except OSError as e:
            self.error = f"{type(e).__name__}: {e}"
            self.close()
            return False
        return True

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self.error = self.error or f"{type(e).__name__}: {e}"
            self._file = None


def read_step_trace(path: Path) -> tuple[list[StepRecord], int]:
    """The steps in time order, and how many lines were unreadable (skipped and counted: the
    last line of a trace read while the twin writes may be cut). Raises OSError."""
    steps: list[StepRecord] = []
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                steps.append(StepRecord.from_json(line))
            except (ValueError, RecursionError):  # a nested bomb is one bad line too
                bad += 1
    steps.sort(key=lambda s: s.end)
    return steps, bad
