"""Drive a vLLM server (or start a local one) and record what every request saw.

Nothing is imported here: `kvwatch.local.server` and the rest load when used.
"""

from __future__ import annotations

__all__: list[str] = []
