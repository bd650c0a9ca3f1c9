"""Process plumbing other rooms share: start and stop a local vLLM (ports, readiness, the stop
by PID), build the tiny model the tests and the demo serve, and ask the installed vLLM for a
model's KV layer specs in a child process (vllm_builder, vllm_specs), which sizing maps into
layers. The load generator, the twin, the fleet, the demo and sizing use it; it imports no
other kvwatch room.
"""

from __future__ import annotations

__all__: list[str] = []
