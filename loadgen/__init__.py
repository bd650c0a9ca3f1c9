"""Drive a vLLM server (or start a local one) and record what every request saw."""

from __future__ import annotations

from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig, ServerStartError
from kvwatch.loadgen.tiny_model import DEFAULT_SPEC, TinyModelSpec, build_tiny_model

__all__ = [
    "LocalVLLM", "ServerConfig", "ServerStartError", "DEFAULT_SPEC", "TinyModelSpec",
    "build_tiny_model",
]  # fmt: skip
