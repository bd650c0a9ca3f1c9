"""The CLI's shared answers: a path the user named that cannot be written is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


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
