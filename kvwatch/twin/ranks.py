"""One rank's KV specs for a simulated TP/PP group, from specs vLLM built for one process.

The twin runs one process, so vLLM builds the model unsharded. A TP rank keeps
`max(1, kv_heads // TP)` of each attention layer's KV heads (vLLM replicates a head when there
are more ranks than heads) and the whole MLA latent; a PP stage keeps its own layers, split as
vLLM's `get_pp_indices` splits them. Recurrent-state layers split their state in model-specific
ways, so the twin refuses TP > 1 for them rather than guess.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

__all__ = ["per_rank", "RankError"]


class RankError(ValueError):
    """The specs cannot be split for this TP/PP; the message says why."""


def per_rank(specs: dict[str, Any], tp: int, pp: int, mla_type: type) -> dict[str, Any]:
    if pp > 1:
        from vllm.distributed.utils import get_pp_indices
        from vllm.model_executor.models.utils import extract_layer_index

        indices = sorted({extract_layer_index(n) for n in specs})
        start, end = get_pp_indices(len(indices), 0, pp)
        keep = set(indices[start:end])
        specs = {n: s for n, s in specs.items() if extract_layer_index(n) in keep}
    if tp == 1:
        return specs
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if isinstance(spec, mla_type):
            out[name] = spec
        elif hasattr(spec, "num_kv_heads"):
            out[name] = replace(spec, num_kv_heads=max(1, spec.num_kv_heads // tp))
        else:
            raise RankError(
                f"{name}: the twin splits attention and MLA layers across TP ranks, not "
                f"{type(spec).__name__}; serve this model with --tp 1"
            )
    return out
