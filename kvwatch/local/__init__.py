"""Process plumbing other rooms share: start and stop a local vLLM (ports, readiness, the stop
by PID) and build the tiny model the tests and the demo serve. The load generator, the twin,
the fleet and the demo use it; it imports no other kvwatch room.
"""

from __future__ import annotations

__all__: list[str] = []
