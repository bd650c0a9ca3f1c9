"""The KV budget vLLM finds from `--gpu-memory-utilization`, estimated before any profiling.

vLLM's GPU worker gives the KV cache `utilization x the card's memory`, less the weights it
loaded and the peak it profiled while running one batch of `max_num_batched_tokens` dummy
tokens (`v1/worker/gpu_worker.py: determine_available_memory`). kvwatch cannot profile a card
it does not have, so the peak is estimated from the two tensors that dominate it: the MLP's
gate-and-up output for a full batch in bf16, and the sampler's fp32 logits for a full batch of
sequences. CUDA graphs' memory (a few hundred MiB) is left out. `--kv-cache-memory-bytes`
makes the budget exact. The what-if and the twin both size with this one function.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.sizing.archconfig import Architecture
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.presets import GpuSpec

__all__ = [
    "Budget",
    "utilization_budget",
    "default_max_num_seqs",
    "activation_peak_bytes",
    "given_kv_bytes",
    "human_readable_int",
]


@dataclass(frozen=True)
class Budget:
    kv_bytes: int
    weights_bytes: float  # per GPU
    activation_bytes: float  # the estimated profiling peak per GPU
    how: str


def default_max_num_seqs(gpu: GpuSpec) -> int:
    """vLLM 0.32's API-server default (`engine/arg_utils.py: get_batch_defaults`): 1,024 on
    the cards that get the large batch defaults, 256 elsewhere."""
    return 1024 if gpu.batched_tokens >= 8192 else 256


def activation_peak_bytes(
    arch: Architecture, batched_tokens: int, max_num_seqs: int, tp: int = 1
) -> float:
    mlp = batched_tokens * 2 * arch.mlp_width * 2 / tp
    logits = max_num_seqs * arch.vocab_size * 4
    return float(mlp + logits)


def utilization_budget(
    arch: Architecture,
    gpu: GpuSpec,
    utilization: float,
    tp: int,
    pp: int,
    batched_tokens: int,
    max_num_seqs: int,
) -> Budget:
    if not 0 < utilization <= 1:
        raise SizingError("--gpu-memory-utilization must be in (0, 1]")
    if gpu.memory_bytes is None:
        raise SizingError(
            f"--gpu {gpu.name}: vLLM's CPU backend is sized by --kv-cache-memory-bytes; give it"
        )
    weights = arch.weight_bytes / (tp * pp)
    act = activation_peak_bytes(arch, batched_tokens, max_num_seqs, tp)
    kv = int(gpu.memory_bytes * utilization - weights - act)
    if kv <= 0:
        raise SizingError(
            f"{arch.name} weights ({weights / 1e9:.0f} GB per GPU) and activations "
            f"({act / 1e9:.1f} GB) do not fit in {utilization:g} x "
            f"{gpu.memory_bytes / 1e9:.0f} GB; raise --tp or --pp"
        )
    how = (
        f"{utilization:g} x {gpu.memory_bytes / 1e9:.0f} GB - {weights / 1e9:.1f} GB of weights "
        f"- {act / 1e9:.2f} GB of activations (estimated: {batched_tokens:,} batched tokens, "
        f"{max_num_seqs:,} sequences) per GPU; vLLM profiles the real peak and also keeps "
        "CUDA graphs, so a little less in practice"
    )
    return Budget(kv, weights, act, how)


def human_readable_int(text: str) -> int:
    """vLLM's reading of `--kv-cache-memory-bytes` (`utils/argparse_utils.py`): a whole number,
    or one with a decimal (k, m, g, t) or binary (K, M, G, T) suffix."""
    import re

    value = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * float(1000 ** ("kmgt".index(suffix) + 1)))
        if "." in number:
            raise SizingError(f"{text!r}: vLLM takes no decimals with a binary suffix")
        return int(number) * (1 << (10 * "KMGT".index(suffix) + 10))
    try:
        return int(value)
    except ValueError:
        raise SizingError(f"{text[:40]!r} is not a byte count vLLM reads") from None


def given_kv_bytes(kv_bytes: int, gpu: GpuSpec) -> int:
    """`--kv-cache-memory-bytes` as given, refused where no card could hold it: vLLM would fail
    to allocate it on the card (and the twin, which allocates nothing, would come up with it)."""
    if kv_bytes <= 0:
        raise SizingError("--kv-cache-memory-bytes must be positive")
    if gpu.memory_bytes is not None and kv_bytes > gpu.memory_bytes:
        raise SizingError(
            f"--kv-cache-memory-bytes {kv_bytes:,} is more than the {gpu.name}'s "
            f"{gpu.memory_bytes / 1e9:.1f} GB; vLLM could not allocate it"
        )
    return kv_bytes
