"""How it is sent: a lean HTTP/1.1 client, one streamed completion recorded as it arrives, the
runner that sends stages on schedule, and the split over worker processes. Imports the
workload and results rooms below it.
"""

from __future__ import annotations

__all__: list[str] = []
