"""The ground floor: what every room shares and that knows nothing of vLLM. The CLI's errors,
exit codes, argument types and lazy handlers (cli_kit.py), the bounded HTTP JSON reader
(http_read.py), the one PromQL reader (promql.py), a receiver for POSTed JSON
(post_receiver.py) and the retry backoff (backoff.py). Imports nothing else of kvwatch."""

from __future__ import annotations

__all__: list[str] = []
