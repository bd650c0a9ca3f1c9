"""The sidecar: observe a vLLM server (metrics and logs), judge KV pressure, export what it sees."""

from __future__ import annotations

__all__: list[str] = []
