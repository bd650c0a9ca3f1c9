"""A loopback webhook receiver for Alertmanager's notifications: keeps each one (which route's
receiver got it, the group, the alerts in it) and can print them as they come."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from kvwatch.common.post_receiver import PostReceiver

__all__ = ["Notification", "NotificationReceiver"]


@dataclass(frozen=True)
class Notification:
    at: float  # wall time it arrived
    path: str  # the receiver's URL path: /alerts (default) or /inference (the pages)
    status: str  # firing or resolved
    group_labels: dict[str, str]
    alerts: tuple[tuple[str, str, dict[str, str]], ...]  # (name, status, labels)

    @property
    def names(self) -> set[str]:
        return {name for name, _, _ in self.alerts}


class NotificationReceiver(PostReceiver):
    def __init__(self, echo: bool = False) -> None:
        super().__init__()
        self.echo = echo
        self.got: list[Notification] = []
        self.refused = 0  # bodies that were not an Alertmanager notification
        self._lock = threading.Lock()

    def take(self, path: str, body: bytes) -> None:
        try:
            doc: dict[str, Any] = json.loads(body)
            alerts = tuple(
                (a["labels"]["alertname"], a["status"], dict(a["labels"])) for a in doc["alerts"]
            )
            note = Notification(
                time.time(), path, str(doc["status"]), dict(doc.get("groupLabels") or {}), alerts
            )
        except (ValueError, KeyError, TypeError):
            with self._lock:
                self.refused += 1
            return
        with self._lock:
            self.got.append(note)
        if self.echo:
            group = ", ".join(f"{k}={v}" for k, v in sorted(note.group_labels.items()))
            names = ", ".join(sorted(note.names))
            print(f">>> alertmanager {path}: {note.status} [{group}] {names}", flush=True)

    def notifications(self) -> list[Notification]:
        with self._lock:
            return list(self.got)
