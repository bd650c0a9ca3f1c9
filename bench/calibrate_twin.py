"""Fit the twin's step-time constants on a real GPU, with PyTorch alone (no vLLM, no network).

Times one decoder layer of a preset's shapes (Llama-style: q/k/v/o projections, grouped-query
attention over a KV cache through torch's SDPA, the gated MLP; random bf16 weights) and scales by
the layer count, plus the LM head:
- decode at batch 1, 32 and 256 over a 1,152-token context, and a 1,500-token prefill;
- fits `hbm_efficiency` from the batch-1 decode (bytes read / time / the card's bandwidth) and
  `mfu` from the prefill (FLOPs / time / the card's bf16 peak), the two constants docs/twin.md
  marks as fitted, and writes them with the date, the device and torch's version.

    python bench/calibrate_twin.py --model llama-3.1-8b --gpu h100 [--device cuda]

Within 5 minutes on an H100 (a few seconds of timing per point). `--quick` runs tiny batches on
the CPU as a smoke test (tests/twin/test_calibrate.py); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.sizing.presets import MODEL_PRESETS
from kvwatch.timing.steptime import ScheduledRequest, StepModel

OUT = Path(__file__).parent / "results" / "twin"


class Layer:
    def __init__(self, cfg: dict[str, Any], device: str) -> None:
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", heads)
        self.d = cfg.get("head_dim") or h // heads
        self.heads = heads
        inter = cfg["intermediate_size"]

        def w(o: int, i: int) -> torch.Tensor:
            return torch.randn(o, i, dtype=torch.bfloat16, device=device) * 0.02

        self.qkv = w((heads + 2 * self.kv_heads) * self.d, h)
        self.o = w(h, heads * self.d)
        self.gate_up = w(2 * inter, h)
        self.down = w(h, inter)

    def bytes(self) -> int:
        return sum(t.numel() * 2 for t in (self.qkv, self.o, self.gate_up, self.down))

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        b, n, _ = x.shape
        qkv = x @ self.qkv.T
        q, k, v = qkv.split(
            [self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1
        )
        q = q.view(b, n, self.heads, self.d).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.d).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.d).transpose(1, 2)
        if kv is not None:  # decode: the new token attends to the whole cache
            k, v = kv
        a = F.scaled_dot_product_attention(q, k, v, is_causal=kv is None, enable_gqa=True)
        x = a.transpose(1, 2).reshape(b, n, -1) @ self.o.T
        g, u = (x @ self.gate_up.T).chunk(2, dim=-1)
        _ = (F.silu(g) * u) @ self.down.T


def _time(fn: Any, device: str, seconds: float) -> float:
    fn()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        sync()
        if time.perf_counter() - t0 > seconds:
            return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100", help="the preset whose peaks the fit is against")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=3.0, help="timing per point")
    ap.add_argument("--quick", action="store_true", help="tiny batches: a smoke test")
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    preset = MODEL_PRESETS[ns.model]
    cfg = preset.config.get("text_config", preset.config)
    gpu = lookup_gpu(ns.gpu)
    layers = cfg["num_hidden_layers"]
    layer = Layer(cfg, ns.device)
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    head = torch.randn(vocab, hidden, dtype=torch.bfloat16, device=ns.device) * 0.02
    context = 64 if ns.quick else 1152
    prefill = 64 if ns.quick else 1500
    batches = (1, 4) if ns.quick else (1, 32, 256)
    rows = []
    for b in batches:
        x = torch.randn(b, 1, hidden, dtype=torch.bfloat16, device=ns.device)
        k = torch.randn(b, layer.kv_heads, context, layer.d, dtype=torch.bfloat16, device=ns.device)
        per_layer = _time(lambda x=x, k=k: layer.forward(x, (k, k)), ns.device, ns.seconds)
        lm = _time(lambda x=x: x @ head.T, ns.device, ns.seconds / 3)
        rows.append({"kind": "decode", "batch": b, "context": context,
                     "step_s": per_layer * layers + lm})  # fmt: skip
    x = torch.randn(1, prefill, hidden, dtype=torch.bfloat16, device=ns.device)
    per_layer = _time(lambda: layer.forward(x, None), ns.device, ns.seconds)
    rows.append({"kind": "prefill", "batch": 1, "tokens": prefill, "step_s": per_layer * layers})
    weights = layer.bytes() * layers + head.numel() * 2
    b1 = rows[0]["step_s"]
    kv_b1 = 2 * layers * layer.kv_heads * layer.d * context * 2
    assert gpu.hbm_bytes_per_s is not None and gpu.bf16_flops is not None
    hbm_eff = (weights + kv_b1) / b1 / gpu.hbm_bytes_per_s
    flops = 2 * (weights / 2) * prefill
    mfu = flops / rows[-1]["step_s"] / gpu.bf16_flops
    model = StepModel(lookup_model(ns.model), gpu)
    for r in rows:
        if r["kind"] == "decode":
            r["model_s"] = model.seconds([ScheduledRequest(1, context)] * r["batch"])
        else:
            r["model_s"] = model.seconds([ScheduledRequest(prefill, prefill)])
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if ns.device.startswith("cuda") else ns.device,
        "torch": torch.__version__,
        "model": ns.model,
        "gpu_preset": gpu.name,
        "quick": ns.quick,
        "rows": rows,
        "fitted": {"hbm_efficiency": hbm_eff, "mfu": mfu},
        "note": "the layer's own kernels, without vLLM's: step_overhead_s is not fitted here",
    }
    path = ns.out or OUT / f"calibration-{ns.model}-{gpu.name}-{out['date'][:10]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
