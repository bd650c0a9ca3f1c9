"""Start a real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1, gossip off."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from kvwatch.alerts.routing import alertmanager_config
from kvwatch.fleet.services import running_service

__all__ = ["running_alertmanager", "shipped_config"]


def shipped_config(webhook_url: str | None = None, hook_base: str | None = None) -> str:
    """The Alertmanager config kvwatch ships (alerts/kvwatch-alertmanager.yml: its routes,
    grouping and inhibit rules) with every route's timers at 1 s, and every receiver posting
    to `webhook_url`, or to its shipped path under `hook_base` (`/alerts` for the default
    receiver, `/inference` for the pages)."""
    cfg = alertmanager_config() if hook_base is None else alertmanager_config(hook_base)
    for r in cfg["receivers"]:
        for hook in r["webhook_configs"]:
            hook["url"] = webhook_url or hook["url"]
    todo = [cfg["route"]]
    while todo:
        route = todo.pop()
        route["group_wait"] = route["group_interval"] = "1s"
        todo.extend(route.get("routes", []))
    return yaml.safe_dump(cfg, sort_keys=False)


@contextmanager
def running_alertmanager(config: str) -> Iterator[str]:
    """`config` is a whole Alertmanager config (`shipped_config` gives the project's)."""
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-am-"))
    (tmp / "am.yml").write_text(config)
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
