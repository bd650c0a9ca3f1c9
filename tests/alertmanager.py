"""Start a real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1, gossip off."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.services import running_service

__all__ = ["running_alertmanager"]


@contextmanager
def running_alertmanager(webhook_url: str) -> Iterator[str]:
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-am-"))
    (tmp / "am.yml").write_text(
        "route:\n  receiver: hook\n  group_by: [alertname, instance, target]\n"
        "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
        f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {webhook_url}\n"
        "        send_resolved: true\n"
    )
    with running_service(
        "alertmanager",
        tmp,
        lambda port: [
            "prometheus-alertmanager",
            f"--config.file={tmp / 'am.yml'}",
            f"--storage.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
    ) as url:
        yield url
