"""The sidecar: observe a vLLM server (metrics and logs), judge KV pressure, export what it sees.

This room holds its parsers (command.py), their handlers (run.py) and the wiring of one
running sidecar (daemon.py), over one room per stage of the flow (docs/architecture.md)."""

from __future__ import annotations

__all__: list[str] = []
