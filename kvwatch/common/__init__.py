"""The ground floor: what every room shares and that knows nothing of vLLM. The CLI's errors,
exit codes and lazy handlers (command.py) and the retry backoff (backoff.py). Imports nothing
else of kvwatch."""

from __future__ import annotations

__all__: list[str] = []
