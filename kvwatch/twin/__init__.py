"""The GPU twin: vLLM's own engine, unchanged, on a simulated accelerator.

A platform plugin (`plugin.py`, inert unless `KVWATCH_TWIN` is set) makes this machine look
like a CUDA card to vLLM; a worker (`worker.py`) builds the model on the meta device for its KV
specs, keeps no weights or KV tensors, and returns each step's sampled tokens when the simulated
card would have finished (`steptime.py`, `card.py`). `command.py` is `kvwatch twin`.
May import: loadgen (the tokenizer build and the server process), sizing, common. Nothing below
imports it.
"""

from __future__ import annotations

__all__: list[str] = []
