"""vLLM's `vllm.platform_plugins` entry point: inert unless the twin was asked for.

vLLM calls this in every process it starts. Installing kvwatch beside a real vLLM changes
nothing: without `KVWATCH_TWIN` (settings.ENV_VAR) in the environment it returns None and vLLM
picks its own platform. It imports nothing heavy, so the check costs nothing.
"""

from __future__ import annotations

import os

from kvwatch.twin.settings import ENV_VAR

__all__ = ["platform_plugin"]


def platform_plugin() -> str | None:
    if not os.environ.get(ENV_VAR):
        return None
    return "kvwatch.twin.platform.TwinPlatform"
