"""Start a real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1, gossip off."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from loadgen.local_server import free_port

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
    port = free_port()
    log = (tmp / "am.log").open("wb")
    proc = subprocess.Popen(
        [
            "prometheus-alertmanager",
            f"--config.file={tmp / 'am.yml'}",
            f"--storage.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("Alertmanager did not start: " + (tmp / "am.log").read_text())
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
