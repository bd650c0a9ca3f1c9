"""The sidecar's shared contract: the names it reads (vocabulary: every vLLM metric spelling),
the names it emits (catalogue: kvwatch_* metrics, states, alert identities), the thresholds it
judges by and the `--threshold` option that changes them, and the states themselves (levels).

The Prometheus rules (alerts/) and the dashboards (dashboards/) read the sidecar only through
this room, so a rename or a new threshold is made once. Imports nothing of the sidecar.
"""

from __future__ import annotations

__all__: list[str] = []
