"""A trace replay's summary (workload/trace.py's `replay_report`, as summary.json keeps it) in
the lines the terminal and the report show."""

from __future__ import annotations

from typing import Any

__all__ = ["render_replay"]


def render_replay(rep: dict[str, Any]) -> str:
    """The replay in a few lines for the terminal."""
    lines = [
        f"trace: {rep['replayed']} of {rep['usable_rows']} usable {rep['format']} requests "
        f"over {rep['span_s']:.1f} s (speed {rep['speed']:g}, lengths x{rep['length_scale']:g})"
    ]
    if rep["time_scale"] != 1.0:
        lines.append(
            f"trace: the target is a twin at time scale {rep['time_scale']:g}: the trace's "
            f"times were stretched as much, so its card sees the trace's own pace"
        )
    if rep.get("rows_outside_window"):
        lines.append(
            f"trace: {rep['rows_outside_window']} rows outside the window were counted, not read"
        )
    if rep["skipped_rows"]:
        said = ", ".join(f"{n} {why}" for why, n in rep["skipped_rows"].items())
        lines.append(f"trace: rows skipped: {said}")
    if rep["clipped"]:
        lines.append(f"trace: {rep['clipped']} requests clipped to the server's max_model_len")
    if rep["shares_prefixes"]:
        implied = f"{rep['implied_prefix_hit_rate']:.1%}"
        measured = rep["measured_prefix_hit_rate"]
        got = "not exported" if measured is None else f"{measured:.1%}"
        lines.append(
            f"trace: prefix-cache hit rate {got} (vLLM's prompt tokens by source); the trace's "
            f"hash_ids imply {implied} for a cache that holds everything"
        )
    return "\n".join(lines)
