"""Start a kvwatch sidecar as its own process beside one server, as it runs in production."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvwatch.common.cli_kit import CliError
from kvwatch.local.server import free_port, stop_process, wait_until_ok

__all__ = ["start_sidecar", "SIDECAR_READY_S"]

SIDECAR_READY_S = 30.0


def start_sidecar(
    target: str,
    run_dir: Path,
    name: str = "sidecar",
    *,
    log: Path | None = None,
    webhook: str | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """The sidecar watching `target` (and its log from the start, if given), scraping once a
    second with a 5 s short window, its database and output in `run_dir/name.*`. Returns the
    process and its URL once `/healthz` answers; raises CliError if it does not start."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "kvwatch", "sidecar", "--target", target,
        "--listen", f"127.0.0.1:{port}", "--interval", "1", "--short-window", "5",
        "--db", str(run_dir / f"{name}.db"), *extra,
    ]  # fmt: skip
    if webhook is not None:
        cmd += ["--webhook", f"{webhook},json"]
    if log is not None:
        cmd += ["--log", str(log), "--log-from-start"]
    out = run_dir / f"{name}.log"
    with out.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if wait_until_ok(url + "/healthz", proc, SIDECAR_READY_S):
        return proc, url
    stop_process(proc)
    raise CliError(f"the sidecar did not start; see {out}")
