"""The twin's facts about each GPU preset beyond the data sheet's in `sizing/presets.py`.

How the card shows itself to vLLM: the name CUDA reports and its compute capability (vLLM picks
batch defaults from the name and memory, `engine/arg_utils.py: get_batch_defaults`: an A100
keeps the small defaults whatever its memory; attention backends from the capability). The
link between the cards of a TP group is a data-sheet fact: `sizing/presets.py`.
"""

from __future__ import annotations

__all__ = ["DEVICE_NAMES", "CAPABILITIES"]

DEVICE_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "a100": "NVIDIA A100-SXM4-80GB",
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "l40s": "NVIDIA L40S",
    "l4": "NVIDIA L4",
    "mi300x": "AMD Instinct MI300X",
}
CAPABILITIES = {
    "h100": (9, 0),
    "h200": (9, 0),
    "b200": (10, 0),
    "a100": (8, 0),
    "a100-40gb": (8, 0),
    "l40s": (8, 9),
    "l4": (8, 9),
    "mi300x": (9, 4),
}
