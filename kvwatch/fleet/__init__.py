"""A fleet on one machine, from real parts: replicas (twins) behind vllm-router, a sidecar
beside each, Prometheus discovering them from files with kvwatch's rules, and Alertmanager
routing as shipped. For the fleet proofs, the demo's `--fleet N` and `kvwatch fleet`.
May import: twin, loadgen (the server process, free ports), alerts (the rules and routing),
common. Only the top floor (the CLI, the demo) imports it.
"""

from __future__ import annotations

__all__: list[str] = []
