"""`kvwatch report`: one self-contained HTML page about a load run (run_page) or a capacity
search (capacity_page), with what both share (parts) and the dependency-free SVG charts they
draw with (svgplot). Pages open offline: inline CSS, inline SVG, no script from a network."""

from __future__ import annotations

__all__: list[str] = []
