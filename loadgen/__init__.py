"""Drive a vLLM server (or start a local one) and record what every request saw.

This room holds the parsers (`command.py`), the handlers (`cmd_run.py`, `cmd_search.py`,
`cmd_local.py`), one measured load (`measure.py`) and the capacity search (`search.py`), over
three rooms: `send` (how a request is sent), `workload` (what is sent) and `results` (what was
seen). A local vLLM is started by `kvwatch.local`. Nothing is imported here: each module loads
when used.
"""

from __future__ import annotations

__all__: list[str] = []
