"""The server's KV event batches recorded during a run (`loadgen run --kv-events ENDPOINT`):
`kv_events.bin` in the run directory, read by `kvwatch advise --run DIR` into the prefix
cache's miss-ratio curve (sidecar/kvevents/recording.py has the format)."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, BinaryIO

from kvwatch.sidecar.judge.prefix_curve import PrefixCurve
from kvwatch.sidecar.kvevents.recording import Frames, write_frame
from kvwatch.sidecar.kvevents.subscriber import KvEventFeed
from kvwatch.sizing.advice import PrefixCurveSeen

__all__ = ["KV_EVENTS_FILE", "KvEventRecorder", "curve_from_recording"]

KV_EVENTS_FILE = "kv_events.bin"
_CONNECT_S = 0.3  # a ZMQ subscriber misses what is published before it has connected


class KvEventRecorder:
    """Subscribes in its own thread from `__enter__` to `__exit__`, writing every batch as it
    came; `summary()` is what the run's summary.json says of it."""

    def __init__(self, endpoint: str, replay: str | None, run_dir: Path) -> None:
        self.path = run_dir / KV_EVENTS_FILE
        self._file: BinaryIO | None = None
        self.feed = KvEventFeed(endpoint, lambda _: None, lambda: None, replay,
                                on_raw=self._write)  # fmt: skip
        self._stop = threading.Event()
        self._th = threading.Thread(target=self.feed.run, args=(self._stop,), daemon=True,
                                    name="kvwatch-kv-events")  # fmt: skip

    def _write(self, seq: int, payload: bytes) -> None:
        if self._file is not None:
            write_frame(self._file, seq, payload)

    def __enter__(self) -> KvEventRecorder:
        self._file = self.path.open("wb")
        self._th.start()
        time.sleep(_CONNECT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(_CONNECT_S)  # the last step's batch is on its way
        self._stop.set()
        self._th.join(5)
        if self._file is not None:
            self._file.close()
            self._file = None

    def summary(self) -> dict[str, Any]:
        return {"file": KV_EVENTS_FILE, **asdict(self.feed.stats)}


def curve_from_recording(
    path: Path, capacity_blocks: int
) -> tuple[PrefixCurveSeen | None, list[str]]:
    """The curve a run's recorded KV events draw, through the checks the sidecar applies on
    the wire, and what was left out of it (RecordingError: not a recording)."""
    frames = Frames(path)
    curve = PrefixCurve()
    st = curve.replay(frames)
    cut = frames.cut
    notes = [f"{path.name}: {what}" for what, bad in (
        (f"{st.missed} batches lost during the run", st.missed),
        (f"{st.refused} batches that are not KV events left out", st.refused),
        (f"{cut} bytes cut off at its end", cut),
        (f"the server restarted {st.restarts} times", st.restarts),
    ) if bad]  # fmt: skip
    return curve.seen(capacity_blocks), notes
