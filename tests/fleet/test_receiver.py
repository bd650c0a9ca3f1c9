"""The lab's Alertmanager receiver and the demo's webhook receiver (both on
kvwatch/common/post_receiver.py): what they keep of a real body's shape, and that a broken body
is counted, not lost silently."""

from __future__ import annotations

import json

import httpx
import pytest

from kvwatch.demo import AlertReceiver
from kvwatch.fleet.receiver import NotificationReceiver

# the shape Alertmanager's webhook sends (version 4), trimmed to what the receiver reads
NOTE = {
    "version": "4",
    "status": "firing",
    "groupLabels": {"model_name": "m"},
    "alerts": [
        {"status": "firing", "labels": {"alertname": "KvwatchFleetKvShortage", "model_name": "m"}}
    ],
}


def test_notifications_are_kept_by_route_and_broken_ones_counted() -> None:
    with NotificationReceiver() as rx:
        httpx.post(rx.base + "/inference", content=json.dumps(NOTE), timeout=5)
        httpx.post(rx.base + "/alerts", content=b"{not json", timeout=5)
        httpx.post(rx.base + "/alerts", content=json.dumps({"status": "firing"}), timeout=5)
        (note,) = rx.notifications()
    assert note.path == "/inference" and note.status == "firing"
    assert note.names == {"KvwatchFleetKvShortage"} and note.group_labels == {"model_name": "m"}
    assert rx.refused == 2


def test_demo_receiver_prints_each_alert_and_counts_broken_bodies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    alert = {"status": "firing", "alertname": "KvwatchThrashing", "annotations": {"summary": "s"}}
    with AlertReceiver() as rx:
        assert rx.url.endswith("/hook")
        httpx.post(rx.url, content=json.dumps(alert), timeout=5)
        httpx.post(rx.url, content=b"\xff", timeout=5)
        httpx.post(rx.url, content=b"[1, 2]", timeout=5)
    assert rx.alerts == [alert] and rx.refused == 2
    assert ">>> webhook: firing KvwatchThrashing: s" in capsys.readouterr().out
