"""The twin's facts about each GPU preset beyond the data sheet's in `sizing/presets.py`.

How the card shows itself to vLLM: the name CUDA reports and its compute capability (vLLM picks
batch defaults from the name and memory, `engine/arg_utils.py: get_batch_defaults`: an A100
keeps the small defaults whatever its memory; attention backends from the capability). And the
link between the cards of a TP group, which the step model's all-reduces cross.
"""

from __future__ import annotations

__all__ = ["DEVICE_NAMES", "CAPABILITIES", "PEER_LINK_BYTES_PER_S", "PCIE4_BYTES_PER_S"]

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
# GPU-to-GPU bandwidth each way, bytes/s (NVLink 4 on H100/H200 SXM: 900 GB/s both ways;
# NVLink 5 on B200: 1.8 TB/s; NVLink 3 on A100 SXM: 600 GB/s; MI300X: 7 Infinity Fabric links
# of 64 GB/s each way). L40S and L4 have no NVLink: their all-reduces cross PCIe 4 x16.
PCIE4_BYTES_PER_S = 32e9
PEER_LINK_BYTES_PER_S = {
    "h100": 450e9,
    "h200": 450e9,
    "b200": 900e9,
    "a100": 300e9,
    "a100-40gb": 300e9,
    "l40s": PCIE4_BYTES_PER_S,
    "l4": PCIE4_BYTES_PER_S,
    "mi300x": 448e9,
}
