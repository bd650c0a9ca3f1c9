"""The card's status between vLLM's processes: a small JSON file, replaced whole each interval.

The worker (engine process) writes; the exporter (API server process) reads at each scrape. A
missing, partial or foreign file reads as no status, never as an error in a scrape.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvwatch.twin.card import CardStatus

__all__ = ["write_status", "read_status"]


def write_status(path: Path, status: CardStatus) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status.to_dict()))
    os.replace(tmp, path)


def read_status(path: Path) -> CardStatus | None:
    try:
        raw = json.loads(path.read_text())
        fields = CardStatus.__dataclass_fields__
        if not isinstance(raw, dict) or set(raw) != set(fields):
            return None
        values = {k: raw[k] for k in fields}
        if not all(isinstance(v, int | float) and v >= 0 for v in values.values()):
            return None
        values["steps"] = int(values["steps"])
        values["steps_total"] = int(values["steps_total"])
        return CardStatus(**values)
    except (OSError, ValueError, TypeError):
        return None
