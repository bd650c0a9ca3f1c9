"""Where a scrape enters: fetch a vLLM server's `/metrics` (scrape), read the exposition text
keeping only the families kvwatch knows (exposition), and turn it into one typed observation
per model and engine (observe). Reads the contract's vocabulary; nothing above."""

from __future__ import annotations

__all__: list[str] = []
