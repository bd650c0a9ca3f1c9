"""The step-time corpus: public real-GPU vLLM figures, each mapped onto the step model.

`bench/corpus/steptime.jsonl` holds one measured figure per line with its provenance (source URL
or repo + path + commit, the exact quoted figure), the model, card, TP, vLLM release, load and
lengths, and its split: `fit` (the constants were fitted to it) or `held_out` (never seen by the
fit). `bench/bench_steptime_corpus.py` curates, fits and reports; `tests/sizing/test_corpus.py`
holds the shipped constants to the held-out part. Runs of one source that share a "run" id are
split together, so a held-out figure never has a sibling from its own run in the fit.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvwatch.sizing.archconfig import Architecture, architecture_from_config
from kvwatch.sizing.budget import utilization_budget
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for
from kvwatch.sizing.presets import MODEL_PRESETS
from kvwatch.timing.loadmodel import ClosedLoop, predict_closed_loop
from kvwatch.timing.measured import Load, predict
from kvwatch.timing.steptime import StepConstants, StepModel

CORPUS = Path(__file__).parent / "corpus" / "steptime.jsonl"
RAW = Path(__file__).parent / "corpus" / "raw"

# the model names sources use -> kvwatch's preset of that shape (same layers, heads, experts)
_MODELS = (
    (r"llama-3(\.1|\.3)?-8b|llama3-8b|llama-3-8b", "llama-3.1-8b"),
    (r"llama-3(\.1|\.3)?-70b|llama3-70b|llama-3-70b", "llama-3.1-70b"),
    (r"llama-3\.1-405b|llama3-405b", "llama-3.1-405b"),
    (r"qwen2(\.5)?-7b", "qwen2.5-7b"),
    (r"qwen2(\.5)?-14b", "qwen2.5-14b"),
    (r"qwen2(\.5)?-32b", "qwen2.5-32b"),
    (r"qwen2(\.5)?-72b", "qwen2.5-72b"),
    (r"qwen3-8b", "qwen3-8b"),
    (r"qwen3-32b", "qwen3-32b"),
    (r"qwen3-30b-a3b", "qwen3-30b-a3b"),
    (r"qwen3-235b-a22b", "qwen3-235b-a22b"),
    (r"qwen3-next-80b", "qwen3-next-80b-a3b"),
    (r"gpt-oss-20b", "gpt-oss-20b"),
    (r"gpt-oss-120b", "gpt-oss-120b"),
    (r"deepseek-(r1|v3)", "deepseek-r1"),
    (r"mixtral-8x7b", "mixtral-8x7b"),
    (r"mixtral-8x22b", "mixtral-8x22b"),
    (r"mistral-7b", "mistral-7b"),
    (r"llama-4-scout", "llama-4-scout"),
    (r"llama-4-maverick", "llama-4-maverick"),
)
# the corpus's weight dtypes -> the quantization_config such a checkpoint ships, read as vLLM
# loads it (kvwatch/sizing/quantized.py); bf16 and fp16: none
_QUANT = {
    "fp8": {"quant_method": "fp8"},
    "mxfp4": {"quant_method": "mxfp4"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128},
    "int4": {"quant_method": "gptq", "bits": 4, "group_size": 128},
}
# checkpoints that quantize less than every linear layer: Meta's own FP8 Llamas (fbgemm_fp8)
# quantize only the MLPs, and not those of the first and last layers; attention, embeddings and
# the LM head stay bf16 (read by kvwatch/sizing/quantized.py, which says what vLLM loaded)
_MLP_ONLY_FP8 = re.compile(r"^meta-llama/.*-fp8$")
# the corpus's metric names -> (measured.py's metric, factor to seconds or tokens/s)
_METRICS = {
    "tpot_ms_median": ("tpot_s", 1e-3),
    "tpot_ms_mean": ("tpot_s", 1e-3),
    "itl_ms_median": ("tpot_s", 1e-3),
    "itl_ms_mean": ("tpot_s", 1e-3),
    "e2e_latency_s": ("e2e_s", 1.0),
    "output_tok_s": ("output_tok_s", 1.0),
    "ttft_ms_median": ("ttft_s", 1e-3),
    "ttft_ms_mean": ("ttft_s", 1e-3),
    "step_ms": ("step_s", 1e-3),
}


@dataclass(frozen=True)
class Point:
    id: str
    row: dict[str, Any]
    arch: Architecture
    gpu: str
    tp: int
    load: Load
    metric: str
    value: float
    split: str

    @property
    def family(self) -> str:
        if self.arch.uses_mla:
            return "mla"
        return "moe" if self.arch.moe_layers else "dense"

    def regime(self) -> str:
        c = self.load.concurrency
        batch = "1" if c == 1 else "2-16" if c <= 16 else "17-64" if c <= 64 else "65-256"
        return f"{self.family} {self.gpu} TP{self.tp} b{batch}"

    def model(self, constants: StepConstants) -> StepModel:
        kv = "fp8" if str(self.row.get("kv_dtype") or "").startswith("fp8") else "auto"
        return StepModel(
            self.arch,
            lookup_gpu(self.gpu),
            tp=self.tp,
            kv_dtype=kv,
            constants=constants,
            before_v1=before_v1(self.row),
        )

    def predict(self, constants: StepConstants) -> float:
        return predict(self.model(constants), self.load, self.metric)


def preset_for(model: str) -> str | None:
    name = model.lower().split("/")[-1]
    for pattern, preset in _MODELS:
        if re.search(pattern, name):
            return preset
    return None


def checkpoint_bytes(preset: str, model: str, wdtype: str) -> float | None:
    """Bytes per parameter of the row's checkpoint of a preset, read through the
    quantization_config it ships (Meta's FP8 Llamas: attention and the first and last MLPs
    unconverted); None: the preset's own."""
    cfg = MODEL_PRESETS[preset].config
    if _MLP_ONLY_FP8.match(model.lower()):
        last = int(cfg["num_hidden_layers"]) - 1
        quant: dict[str, Any] | None = {
            "quant_method": "fbgemm_fp8",
            "modules_to_not_convert": [
                "self_attn", "model.layers.0.mlp", f"model.layers.{last}.mlp"
            ],
        }  # fmt: skip
    elif wdtype in ("bf16", "fp16"):
        quant = None
    elif wdtype in _QUANT:
        shipped = cfg.get("quantization_config") or {}
        # the preset's own list of unconverted modules, where it ships one of this method
        same = shipped.get("quant_method") == _QUANT[wdtype]["quant_method"]
        quant = {**_QUANT[wdtype], **(shipped if same else {})}
    else:
        return None
    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    if quant:
        cfg["quantization_config"] = quant
    return architecture_from_config(cfg, preset).weight_bytes_per_param


def kv_fit(
    arch: Architecture,
    gpu: str,
    tp: int,
    kv: str,
    p: int,
    o: int,
    batched: int,
    capacity_tokens: int | None = None,
) -> int:
    """How many requests of P + O tokens the KV cache holds at once on this deployment
    (vLLM's default 0.9 of the card, as the releases in the corpus had, or the capacity the
    source states): past it, a closed batch runs that many at a time, as vLLM admits only what
    fits (kvwatch/timing/measured.py)."""
    spec = lookup_gpu(gpu)
    layout = layout_for(arch, Serving(p + o, kv_dtype=kv, tp=tp), PLATFORMS[spec.platform])
    if capacity_tokens:
        blocks = capacity_tokens // layout.block_size
    else:
        try:
            budget = utilization_budget(arch, spec, 0.9, tp, 1, batched, 256)
        except SizingError:
            return 1
        blocks = budget.kv_bytes // layout.bytes_per_block
    fit = predict_closed_loop(ClosedLoop(1, p, o), layout, blocks, batched, 10**6, None)
    return max(1, fit.fits_concurrency)


def _load(row: dict[str, Any], gpu: str, arch: Architecture) -> tuple[Load, str, float]:
    kind, c = row["load"], int(row["batch_or_concurrency"])
    p, o = int(row["input_len"]), int(row["output_len"])
    metric, value = row["metric"], float(row["value"])
    if metric == "total_tok_s":  # offline throughput of prompts sent at once: a closed batch
        kind, metric, value = "closed_batch", "e2e_latency_s", c * (p + o) / value
    name, factor = _METRICS[metric]
    if kind in ("offline_throughput", "request_rate"):
        kind = "closed_batch"  # every prompt at once (the rows that are kept say so)
    kinds = {"closed_batch": "closed_batch", "fixed_concurrency": "fixed_concurrency"}
    kinds["single_step"] = "step"
    spec = lookup_gpu(gpu)
    batched = int(row.get("max_num_batched_tokens") or spec.batched_tokens)
    if before_v1(row):  # no chunked prefill: whole prompts up to max_model_len in one step
        batched = max(batched, 32768, p + o)
    kv = "fp8" if str(row.get("kv_dtype") or "").startswith("fp8") else "auto"
    capacity = row.get("kv_capacity_tokens")
    fits = kv_fit(arch, gpu, int(row["tp"]), kv, p, o, batched, int(capacity) if capacity else None)
    load = Load(
        kinds[kind],  # type: ignore[arg-type]
        c,
        p,
        o,
        batched_tokens=batched,
        max_num_seqs=min(int(row.get("max_num_seqs") or 256), fits),
    )
    return load, name, value * factor


def before_v1(row: dict[str, Any]) -> bool:
    """A release before V1 became the default (0.8), or an unnamed one from before 2025."""
    v = str(row.get("vllm_version") or "")
    m = re.match(r"0\.(\d+)", v)
    if m:
        return int(m.group(1)) < 8
    return str(row.get("date") or "9999") < "2025"


def split_of(row: dict[str, Any]) -> str:
    """One in three runs held out, by a stable hash of the run (or the point's own id)."""
    key = str(row.get("run") or row["id"])
    return "held_out" if zlib.crc32(key.encode()) % 3 == 0 else "fit"


def to_point(row: dict[str, Any]) -> Point:
    preset = preset_for(str(row["model"]))
    if preset is None:
        raise ValueError(f"{row['id']}: no preset of {row['model']!r}'s shape")
    arch = lookup_model(preset)
    wbytes = checkpoint_bytes(preset, str(row["model"]), str(row.get("weights_dtype") or "bf16"))
    if wbytes is not None:
        arch = replace(arch, weight_bytes_per_param=wbytes)
    gpu = str(row["gpu"]).lower()
    load, metric, value = _load(row, gpu, arch)
    return Point(
        str(row["id"]), row, arch, gpu, int(row["tp"]), load, metric, value, str(row["split"])
    )


def read(path: Path = CORPUS) -> list[Point]:
    return [to_point(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out
