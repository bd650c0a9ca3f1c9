"""Where vLLM's KV event stream enters: its messages read and checked (wire) and the ZMQ
subscription that follows a server's publisher across gaps and restarts (subscriber). What
the events mean for the cache's sizing is the judge's (block_access, reuse_curve)."""

from __future__ import annotations

__all__: list[str] = []
