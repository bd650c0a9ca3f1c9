"""The sidecar image builds from what the wheel builds from: every source folder pyproject.toml
maps into the `kvwatch` namespace is copied, and nothing the image does not need."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


def source_folders() -> set[str]:
    """The folders the wheel is built from (pyproject.toml's package-dir)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(doc["tool"]["setuptools"]["package-dir"].values())


def _copied() -> set[str]:
    out: set[str] = set()
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"\s*COPY\s+(.+)$", line)
        if m and not m.group(1).startswith("--from"):
            *sources, _dest = m.group(1).split()
            out |= set(sources)
    return out


def test_the_image_copies_what_the_wheel_is_built_from() -> None:
    copied = _copied()
    assert copied - {"pyproject.toml", "README.md"} == source_folders()
    assert {"pyproject.toml", "README.md"} <= copied  # the build reads both
    for src in copied:
        assert (ROOT / src).exists(), src


def test_the_build_context_leaves_out_the_heavy_folders() -> None:
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().split()}
    assert {".venv", "**/node_modules", ".wheelhouse", "build"} <= ignored
