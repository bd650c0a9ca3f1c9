"""What was seen: the request records, the server's own view from /metrics, the summaries,
stall causes (and the twin's step trace they are held to: step_trace, stall_truth), the
working set, the run directory (rundir writes it, run_schema checks it),
and the typed values every reader outside loadgen takes instead of its JSON: a run read once
(run_files), its view for the advice (run_observed), a search's verdict (search_file).
Imports no other loadgen room.
"""

from __future__ import annotations

__all__: list[str] = []
