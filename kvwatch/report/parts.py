"""What the run report and the capacity page share: the look, and the sizing advice of a run
directory computed again from its files."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvwatch.loadgen.results.run_files import RunFiles

__all__ = ["CSS", "advice_html", "model_html"]

CSS = """
body{font-family:sans-serif;max-width:980px;margin:24px auto;padding:0 16px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0}.verdict{padding:12px 16px;border-radius:6px;margin:16px 0}
.bad{background:#fde8e8;border-left:6px solid #d62728}
.good{background:#e8f6e8;border-left:6px solid #2ca02c}
table{border-collapse:collapse;margin:8px 0}
td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:12px}
svg.kvw-chart{width:100%;height:auto;margin:6px 0}.note{color:#666;font-size:13px}
code.key{color:#666;font-size:12px}
"""


def model_html(model: object) -> str:
    """The model as a reader knows it: a local directory by its last part (the whole path on
    hover), a hub name (org/name) as it is."""
    text = str(model or "?")
    local = text.startswith(("/", "./", "../", "~")) or "\\" in text
    name = text.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] if local else text
    title = f" title='{escape(text)}'" if local and name != text else ""
    return f"<code{title}>{escape(name or text)}</code>"


def advice_html(run: RunFiles) -> tuple[str, str | None]:
    """The advice of a run, computed again from its files (read once, by the caller)."""
    from kvwatch.loadgen.results.run_observed import observed_from_files, server_from_files
    from kvwatch.sizing.advice import advise
    from kvwatch.sizing.errors import SizingError

    try:
        obs = observed_from_files(run)
    except SizingError as e:
        return f"<p class='note'>No advice: {escape(str(e))}</p>", None
    adv = advise(obs, server=server_from_files(run))
    parts = [
        f"<p><b>{escape(adv.verdict)}</b></p>",
        f"<p>Advised for {escape(adv.advised_for)}.</p>",
    ]
    if adv.recommended:
        parts.append(f"<p>Recommended: {escape(adv.recommended)}</p>")
    if adv.options:
        parts.append("<p>Change one of:</p><ul>")
        parts += [f"<li><code>{escape(o)}</code></li>" for o in adv.options]
        parts.append("</ul>")
    parts.append("<p>The arithmetic:</p><pre>" + escape("\n".join(adv.arithmetic)) + "</pre>")
    parts.append("<p class='note'>Assumptions: " + escape("; ".join(adv.assumptions)) + "</p>")
    return "".join(parts), adv.verdict
