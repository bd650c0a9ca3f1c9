"""The sidecar's `GET /api/readings`: each engine's recent counters, for `calibrate --sidecar`.

The sidecar already scrapes every engine each interval and keeps its timeline (up to 900
points); this hands the counters a step model is calibrated from (the inter-token latency and
time-to-first-token histograms' sums and counts, the finished requests' length histograms,
preemptions, the requests held, and since format 2 the engine's steps, the prompt tokens it
computed and the tokens it generated) to a calibration at once, with no watch to wait through.
A format 1 document (an older sidecar) is read too, without the last three.
Times are the judges' clock: a twin's simulated seconds, and its gaps already divided by its
time scale, so the figures are in the twin's time and `time_base` says so. One format, written
by the sidecar's state and read here, checked where it enters: a reader takes any document.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from kvwatch.timing.server_slices import Reading

__all__ = ["FORMAT", "FIELDS", "MAX_READINGS", "ReadingsError", "readings_from_json"]

FORMAT = "kvwatch-readings/2"
_FORMAT_1 = "kvwatch-readings/1"
# one reading's values, in this order (null where the server lacks the family)
FIELDS = ("t", "held", "itl_sum", "itl_count", "prompt_sum", "prompt_count", "output_sum",
          "output_count", "preemptions", "ttft_sum", "ttft_count", "steps",
          "prompt_computed", "generated")  # fmt: skip
_FIELDS_1 = 11  # format 1 ended at ttft_count
MAX_READINGS = 100_000  # per engine: the sidecar keeps 900; past this is not a sidecar
_MAX_ENGINES = 1024
_MAX_VALUE = 1e18  # as the sidecar's parser bounds a counter


class ReadingsError(ValueError):
    """Not a readings document (one line)."""


def readings_from_json(doc: Any) -> tuple[dict[str, list[Reading]], dict[str, float]]:
    """Per engine (named "target model engine N"), its readings; and per engine its time
    scale (1: wall time; K: a twin's, whose readings are in its simulated seconds). Readings
    with a value that is not a finite number in range are dropped (a reading lost is a slice
    lost, never a wrong one)."""
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, _FORMAT_1):
        raise ReadingsError(f"not a sidecar's readings (format {FORMAT})")
    width = len(FIELDS) if doc["format"] == FORMAT else _FIELDS_1
    engines = doc.get("engines")
    if not isinstance(engines, list) or len(engines) > _MAX_ENGINES:
        raise ReadingsError(f"engines must be a list of at most {_MAX_ENGINES}")
    out: dict[str, list[Reading]] = {}
    scales: dict[str, float] = {}
    for e in engines:
        if not isinstance(e, dict):
            continue
        engine = _text(e.get("engine")) or "0"
        name = f"{_text(e.get('target'))} {_text(e.get('model'))} engine {engine}"
        rows = e.get("readings")
        if not isinstance(rows, list) or len(rows) > MAX_READINGS:
            continue
        k = e.get("time_scale")
        scales[name] = float(k) if _is_number(k) and 0 < k < 1e6 else 1.0
        out[name] = [r for row in rows if (r := _reading(row, width)) is not None]
    return out, scales


def _reading(row: Any, width: int) -> Reading | None:
    if not isinstance(row, list) or len(row) != width:
        return None
    vals: list[float | None] = []
    for i, v in enumerate(row):
        if v is None and i > 0:
            vals.append(None)
            continue
        if not _is_number(v):
            return None
        v = float(v)
        if not math.isfinite(v) or (i > 0 and not 0 <= v <= _MAX_VALUE):
            return None
        vals.append(v)
    t = vals[0]
    return None if t is None else Reading(t, *vals[1:])


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _text(v: Any) -> str:
    return v.replace("\n", " ")[:200] if isinstance(v, str) else ""
