"""The twin's metrics on vLLM's own /metrics: the time scale, and how well the card kept time.

The worker runs in vLLM's engine process and writes its card status to a small JSON file
(`status.py`); this collector, registered in the API server's process, reads it at each scrape.
The time scale is there from the start, so anything that reads /metrics (the sidecar, the load
generator) learns it before its first judgement.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.sidecar.contract.twin_metrics import TWIN_METRICS
from kvwatch.twin.settings import TwinSettings
from kvwatch.twin.status import read_status

__all__ = ["TwinCollector", "register"]

_registered = False


class TwinCollector(Collector):
    def __init__(self, settings: TwinSettings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        s = self.settings
        m = TWIN_METRICS
        info = GaugeMetricFamily(
            m.info,
            "The kvwatch twin: simulated card, model and parallelism",
            labels=["gpu", "model", "tp", "pp"],
        )
        info.add_metric([s.gpu, s.model, str(s.tp), str(s.pp)], 1)
        yield info
        yield GaugeMetricFamily(
            m.time_scale,
            "Wall seconds per simulated second: every duration the twin simulates is this many "
            "times longer on the wall clock",
            value=s.time_scale,
        )
        st = read_status(Path(s.status_path)) if s.status_path else None
        if st is None:
            return
        yield GaugeMetricFamily(
            m.busy_share, "Share of the last interval the simulated card computed", st.busy_share
        )
        yield GaugeMetricFamily(
            m.behind_share,
            "Share of the last interval the card sat idle while running requests waited on this "
            "machine's CPU (the twin falling behind)",
            st.behind_share,
        )
        yield CounterMetricFamily(
            m.simulated_seconds, "Simulated seconds the card computed", st.simulated_s_total
        )
        yield CounterMetricFamily(
            m.behind_seconds, "Wall seconds the card sat idle with work waiting", st.behind_s_total
        )
        yield CounterMetricFamily(m.steps, "Engine steps the card ran", st.steps_total)


def register(settings: TwinSettings) -> None:
    global _registered
    if not _registered:
        REGISTRY.register(TwinCollector(settings))
        _registered = True
