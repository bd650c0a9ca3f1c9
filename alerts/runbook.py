"""The runbook the package ships (one `## AlertName` section per alert), read from the
installed package so an on-call engineer has it without a browser."""

from __future__ import annotations

from importlib import resources

__all__ = ["RUNBOOK_FILE", "read_runbook", "sections", "section"]

RUNBOOK_FILE = "runbook.md"


def read_runbook() -> str:
    return resources.files(__package__).joinpath(RUNBOOK_FILE).read_text(encoding="utf-8")


def sections(text: str) -> dict[str, str]:
    """`## Name` heading -> that section's text (heading included), in the runbook's order."""
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            if name is not None:
                out[name] = "".join(lines).rstrip() + "\n"
            name, lines = line[3:].strip(), []
        if name is not None:
            lines.append(line)
    if name is not None:
        out[name] = "".join(lines).rstrip() + "\n"
    return out


def section(text: str, alert: str) -> str | None:
    """One alert's section, its name matched without regard to case; None if it has none."""
    by_lower = {k.lower(): v for k, v in sections(text).items()}
    return by_lower.get(alert.lower())
