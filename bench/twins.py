"""The benches' twin at H100 scale: `MODEL:GPU:KV_BYTES` on the command line, one exact KV
budget, time scale 1 (simulated and wall seconds are one)."""

from __future__ import annotations

from pathlib import Path

from kvwatch.twin.serve import TwinServer, start_twin

__all__ = ["twin_from_spec"]


def twin_from_spec(spec: str, log: Path, *extra: str) -> TwinServer:
    """Start the twin `spec` names (e.g. llama-3.1-8b:h100:16777216000), its status beside
    `log`; use it as a context manager to stop it."""
    try:
        model, gpu, kv = spec.split(":")
        kv_bytes = int(kv)
    except ValueError:
        raise SystemExit(f"--twin {spec!r}: use MODEL:GPU:KV_BYTES") from None
    return start_twin(
        model, gpu, log, time_scale=1.0, status_dir=log.parent,
        vllm_args=("--max-model-len", "4096", "--kv-cache-memory-bytes", str(kv_bytes), *extra),
    )  # fmt: skip
