"""Where a log line enters: follow a file, stdin or a command vLLM runs under (follow), parse
each line of every release's formats (logformats), tell incidents apart (incidents), keep what a
target's log said (logstate), and summarise a whole log for `kvwatch logs` (logsummary). May use
the metrics room's typed values (a capacity line becomes a CacheConfig)."""

from __future__ import annotations

__all__: list[str] = []
