"""Each stall's cause as the twin's steps show it: the truth `stall_causes.attribute_stalls` is
held to (bench/bench_stall_causes.py).

A request's stall is the time between two of its tokens. vLLM runs every running request in
every step, so the second token came from the first step after the first one that ran the
request again; what the steps between them (ending inside the stall) carried says why:
- the request preempted in one of them: `preempted`;
- left out of one (not finished, not preempted): `queue`;
- else the card was busy for under half of the stall: `host` (the engine, the API server or
  the client was behind, not the card);
- else the steps' recomputed tokens against their new prompt tokens: `recompute` or `prefill`;
  neither (decode steps alone as long as a stall): `unknown`.
The run's records name their requests to the server by `server_id` (`X-Request-Id`); vLLM's
own id is `cmpl-{server_id}-{index}-{8 hex}` (completions) or `chatcmpl-{server_id}-{8 hex}`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from kvwatch.loadgen.results.step_trace import StepRecord

__all__ = ["truth_causes", "engine_to_server_ids"]

# a step that preempts or leaves out a request is scheduled while the one before runs (async
# scheduling), and the token before the stall reaches the client after its step: the step
# that stopped the request may end this long before the client saw its last token
_EARLY_S = 0.2
_BUSY = 0.5  # share of the stall the card must have computed for the steps to explain it


def engine_to_server_ids(engine_ids: Iterable[str], server_ids: set[str]) -> dict[str, str]:
    """Each engine id whose request the run sent, to that request's `server_id`."""
    out = {}
    for eid in engine_ids:
        head, _, rest = eid.partition("-")  # cmpl / chatcmpl
        if not rest:
            continue
        cut = rest
        for _ in range(3):  # at most `-{index}-{hex}` to strip
            if cut in server_ids:
                out[eid] = cut
                break
            cut, sep, _ = cut.rpartition("-")
            if not sep:
                break
    return out


def truth_causes(
    records: list[dict[str, Any]], steps: list[StepRecord], start_unix: float
) -> dict[str, list[str]]:
    """For each record with stalls and a `server_id`, the true cause of each of its stalls,
    in the order of its `stall_spans`."""
    ends = [s.end for s in steps]
    server_ids = {r["server_id"] for r in records if r.get("server_id")}
    ids = {eid for st in steps for eid in (*st.preempted, *st.skipped)}
    to_server = engine_to_server_ids(ids, server_ids)
    out: dict[str, list[str]] = {}
    for r in records:
        sid = r.get("server_id")
        if not sid or not r.get("stall_spans"):
            continue
        causes = []
        for s, e in r["stall_spans"]:
            a, b = start_unix + s, start_unix + e
            stop = bisect.bisect_left(ends, b)
            wide = steps[bisect.bisect_right(ends, a - _EARLY_S) : stop]
            narrow = steps[bisect.bisect_right(ends, a) : stop]
            causes.append(_cause(sid, wide, narrow, b - a, to_server))
        out[sid] = causes
    return out


def _cause(
    sid: str,
    wide: list[StepRecord],
    narrow: list[StepRecord],
    gap: float,
    to_server: dict[str, str],
) -> str:
    """`wide`: the steps that may have stopped the request; `narrow`: those run in the stall."""
    if any(to_server.get(eid) == sid for st in wide for eid in st.preempted):
        return "preempted"
    if any(to_server.get(eid) == sid for st in wide for eid in st.skipped):
        return "queue"
    if sum(st.card_s for st in narrow) < _BUSY * gap:
        return "host"
    recompute = sum(st.recompute for st in narrow)
    prefill = sum(st.prefill for st in narrow)
    if not recompute and not prefill:
        return "unknown"
    return "recompute" if recompute >= prefill else "prefill"
