"""The CLI's shared answers: a path the user named that cannot be written is one line, exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.common.cli_kit import http_url
from kvwatch.local.server import free_port


@pytest.mark.parametrize("command", ["alerts", "dashboards"])
def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path: Path, command: str) -> None:
    """These were tracebacks (NotADirectoryError, FileExistsError, PermissionError)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, why in (
        (blocker / "rules", "Not a directory"),
        (blocker, "a file is in the way of a folder"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", command, "--out", str(out)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().splitlines() == [f"kvwatch: error: cannot write {out}: {why}"]


def _kvwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "url", ["notaurl", "ftp://h/x", "http://", "http://h:99999", "http://h /x", "//h:1"]
)
def test_a_server_flag_takes_only_an_http_url(url: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="URL"):
        http_url(url)
    assert http_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert http_url("https://h/prefix/metrics") == "https://h/prefix/metrics"


@pytest.mark.parametrize(
    "args",
    [
        ("loadgen", "run", "--rate", "1", "--url"),
        ("loadgen", "search", "--slo", "ttft=1s", "--url"),
        ("sidecar", "--db", "", "--target"),
        ("advise", "--metrics"),
        ("advise", "--prometheus"),
    ],
)
def test_a_bad_url_is_a_usage_error_and_credentials_are_never_echoed(
    args: tuple[str, ...],
) -> None:
    """`loadgen run --url notaurl` exited 3 (unreachable) where it is a usage error; a URL with
    credentials went verbatim into the startup line, every label and the webhook text."""
    p = _kvwatch(*args, "notaurl")
    assert p.returncode == 2 and "not an http(s) URL" in p.stderr, p.stderr
    p = _kvwatch(*args, "http://admin:s3cret@127.0.0.1:9")
    assert p.returncode == 2 and "credentials" in p.stderr and "s3cret" not in p.stderr
    p = _kvwatch(*args, "http://admin:s3cret@")
    assert p.returncode == 2 and "s3cret" not in p.stderr


def test_an_unreachable_prometheus_exits_3_like_every_other_source() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for source in ("--prometheus", "--metrics", "--sidecar"):
        p = _kvwatch("advise", source, url)
        assert p.returncode == 3 and "Traceback" not in p.stderr, (source, p.stderr)
