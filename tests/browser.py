"""Open a local page in Debian's headless Chromium (through playwright, never its own browser
download) and report what a user's browser would: console errors, network requests, a picture."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PageCheck", "open_page", "CHROMIUM"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    svg_sizes: list[tuple[float, float]] = field(default_factory=list)
    svg_marks: list[int] = field(default_factory=list)  # drawn shapes per chart
    # pairs of chart labels (stage marks) whose drawn boxes overlap, and labels drawn past
    # their chart's edge: what a reader cannot read
    label_overlaps: list[tuple[str, str]] = field(default_factory=list)
    labels_outside: list[str] = field(default_factory=list)
    label_count: int = 0


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def _check_labels(svg: Any, frame: dict[str, float] | None, check: PageCheck) -> None:
    """The drawn boxes of a chart's stage labels, as Chromium lays them out."""
    labels = []
    for el in svg.query_selector_all("text.kvw-mark"):
        box = el.bounding_box()
        text = el.evaluate("e => e.lastChild ? e.lastChild.textContent : ''")
        if box is not None:
            labels.append((text, box))
    check.label_count += len(labels)
    for i, (ta, a) in enumerate(labels):
        right = a["x"] + a["width"]
        if frame is not None and (a["x"] < frame["x"] or right > frame["x"] + frame["width"] + 0.5):
            check.labels_outside.append(ta)
        check.label_overlaps += [(ta, tb) for tb, b in labels[i + 1 :] if _overlap(a, b)]


def open_page(path: Path, screenshot: Path) -> PageCheck:
    from playwright.sync_api import sync_playwright

    check = PageCheck()
    profile = tempfile.mkdtemp(prefix="kvwatch-chromium-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=_FLAGS,
                viewport={"width": 1000, "height": 800},
            )  # fmt: skip
            page = ctx.new_page()
            page.on(
                "console",
                lambda m: check.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: check.page_errors.append(str(e)))
            page.on("request", lambda r: check.requests.append(r.url))
            page.goto(path.resolve().as_uri(), wait_until="load")
            for svg in page.query_selector_all("svg"):
                box = svg.bounding_box()
                check.svg_sizes.append((box["width"], box["height"]) if box else (0.0, 0.0))
                check.svg_marks.append(len(svg.query_selector_all("path, circle, rect")))
                _check_labels(svg, box, check)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return check
