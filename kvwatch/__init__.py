"""kvwatch: see, alert on and size away KV cache thrashing in vLLM (the `kvwatch` command)."""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
