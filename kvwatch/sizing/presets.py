"""Named models and GPUs for the what-if: the public config.json facts, no weights.

Each model preset is the part of its Hugging Face `config.json` that sizing reads (so it goes
through the same `architecture_from_config` as a user's file) plus the published parameter
counts, which the shapes alone get only approximately. GPUs: memory, dense bf16 FLOP/s,
HBM bandwidth and the host link, from the vendors' data sheets (SXM/OAM parts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ModelPreset",
    "MODEL_PRESETS",
    "GpuSpec",
    "GPU_PRESETS",
    "GPU_ALIASES",
    "LINK_BYTES_PER_S",
    "PEER_LINK_BYTES_PER_S",
]


@dataclass(frozen=True)
class ModelPreset:
    config: dict[str, Any]
    params_total: float
    params_active: float | None = None  # MoE: per token; None: all of them


def _llama(layers: int, hidden: int, heads: int, inter: int, params: float) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": inter,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        },
        params,
    )


def _qwen3(
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    inter: int,
    params: float,
    experts: int = 0,
    per_tok: int = 0,
    moe_inter: int = 0,
    active: float | None = None,
) -> ModelPreset:
    cfg: dict[str, Any] = {
        "architectures": ["Qwen3MoeForCausalLM" if experts else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if experts else "qwen3",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 128,
        "intermediate_size": inter,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "sliding_window": None,
        "use_sliding_window": False,
        "torch_dtype": "bfloat16",
    }
    if experts:
        cfg |= {
            "num_experts": experts,
            "num_experts_per_tok": per_tok,
            "moe_intermediate_size": moe_inter,
        }
    return ModelPreset(cfg, params, active)


def _gpt_oss(layers: int, experts: int, params: float, active: float) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "num_hidden_layers": layers,
            "hidden_size": 2880,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "intermediate_size": 2880,
            "num_local_experts": experts,
            "num_experts_per_tok": 4,
            "sliding_window": 128,
            "vocab_size": 201088,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
            # as the checkpoints ship it: attention, router, embeddings and LM head in bf16
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head",
                ],
            },  # fmt: skip
        },
        params,
        active,
    )


def _gemma3(
    layers: int, hidden: int, heads: int, kv: int, head: int, inter: int, params: float
) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "num_hidden_layers": layers,
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "head_dim": head,
                "intermediate_size": inter,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "vocab_size": 262208,
                "max_position_embeddings": 131072,
            },
            "torch_dtype": "bfloat16",
        },
        params,
    )


def _deepseek(
    arch: str, heads: int, experts: int, dense: int, vocab: int, params: float, active: float
) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": [arch],
            "model_type": "deepseek_v3" if arch != "KimiK2ForCausalLM" else "kimi_k2",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "n_routed_experts": experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": dense,
            "vocab_size": vocab,
            "max_position_embeddings": 163840 if heads == 128 else 131072,
            "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8"},
        },
        params,
        active,
    )


def _llama4(experts: int, step: int, params: float) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["Llama4ForConditionalGeneration"],
            "model_type": "llama4",
            "text_config": {
                "model_type": "llama4_text",
                "num_hidden_layers": 48,
                "hidden_size": 5120,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 8192,
                "intermediate_size_mlp": 16384,
                "num_local_experts": experts,
                "num_experts_per_tok": 1,
                "interleave_moe_layer_step": step,
                "attention_chunk_size": 8192,
                "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)],
                "vocab_size": 202048,
                "max_position_embeddings": 10485760 if experts == 16 else 1048576,
            },
            "torch_dtype": "bfloat16",
        },
        params,
        17e9,
    )


def _mistral(
    layers: int, hidden: int, heads: int, head: int, inter: int, vocab: int, params: float
) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": head,
            "intermediate_size": inter,
            "vocab_size": vocab,
            "sliding_window": None,
            "max_position_embeddings": 32768,
            "torch_dtype": "bfloat16",
        },
        params,
    )


def _mixtral(
    layers: int, hidden: int, heads: int, inter: int, vocab: int, params: float, active: float
) -> ModelPreset:
    """Mistral's shapes with 8 experts, 2 per token."""
    base = _mistral(layers, hidden, heads, 128, inter, vocab, params).config
    moe = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 65536 if layers > 32 else 32768,
    }
    return ModelPreset(base | moe, params, active)


def _qwen2(layers: int, hidden: int, heads: int, kv: int, inter: int, params: float) -> ModelPreset:
    return ModelPreset(
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "intermediate_size": inter,
            "vocab_size": 152064,
            "sliding_window": 131072,
            "use_sliding_window": False,
            "max_position_embeddings": 32768,
            "torch_dtype": "bfloat16",
        },
        params,
    )


_QWEN3_NEXT = ModelPreset(
    {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "intermediate_size": 5120,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    },
    81.3e9,
    3.0e9,
)

MODEL_PRESETS: dict[str, ModelPreset] = {
    "llama-3.1-8b": _llama(32, 4096, 32, 14336, 8.03e9),
    "llama-3.1-70b": _llama(80, 8192, 64, 28672, 70.6e9),
    "llama-3.1-405b": _llama(126, 16384, 128, 53248, 405.8e9),
    "llama-3.3-70b": _llama(80, 8192, 64, 28672, 70.6e9),
    "llama-4-scout": _llama4(16, 1, 109e9),
    "llama-4-maverick": _llama4(128, 2, 400e9),
    "qwen2.5-7b": _qwen2(28, 3584, 28, 4, 18944, 7.62e9),
    "qwen2.5-14b": _qwen2(48, 5120, 40, 8, 13824, 14.7e9),
    "qwen2.5-32b": _qwen2(64, 5120, 40, 8, 27648, 32.8e9),
    "qwen2.5-72b": _qwen2(80, 8192, 64, 8, 29568, 72.7e9),
    "qwen3-8b": _qwen3(36, 4096, 32, 8, 12288, 8.19e9),
    "qwen3-32b": _qwen3(64, 5120, 64, 8, 25600, 32.8e9),
    "qwen3-30b-a3b": _qwen3(48, 2048, 32, 4, 6144, 30.5e9, 128, 8, 768, 3.3e9),
    "qwen3-235b-a22b": _qwen3(94, 4096, 64, 4, 12288, 235e9, 128, 8, 1536, 22e9),
    "qwen3-next-80b-a3b": _QWEN3_NEXT,
    "gpt-oss-20b": _gpt_oss(24, 32, 20.9e9, 3.6e9),
    "gpt-oss-120b": _gpt_oss(36, 128, 116.8e9, 5.1e9),
    "gemma-3-12b": _gemma3(48, 3840, 16, 8, 256, 15360, 12.2e9),
    "gemma-3-27b": _gemma3(62, 5376, 32, 16, 128, 21504, 27.4e9),
    "deepseek-v3": _deepseek("DeepseekV3ForCausalLM", 128, 256, 3, 129280, 671e9, 37e9),
    "deepseek-r1": _deepseek("DeepseekV3ForCausalLM", 128, 256, 3, 129280, 671e9, 37e9),
    "kimi-k2": _deepseek("DeepseekV3ForCausalLM", 64, 384, 1, 163840, 1.04e12, 32e9),
    "mistral-7b": _mistral(32, 4096, 32, 128, 14336, 32768, 7.25e9),
    "mistral-small-24b": _mistral(40, 5120, 32, 128, 32768, 131072, 23.6e9),
    "mixtral-8x7b": _mixtral(32, 4096, 32, 14336, 32000, 46.7e9, 12.9e9),
    "mixtral-8x22b": _mixtral(56, 6144, 48, 16384, 32768, 140.6e9, 39.1e9),
}


# bytes/s each way over a x16 host link
LINK_BYTES_PER_S = {"pcie4": 32e9, "pcie5": 64e9, "pcie6": 128e9}
# GPU-to-GPU bandwidth each way, bytes/s (NVLink 4 on H100/H200 SXM: 900 GB/s both ways;
# NVLink 5 on B200: 1.8 TB/s; NVLink 3 on A100 SXM: 600 GB/s; MI300X: 7 Infinity Fabric links
# of 64 GB/s each way). L40S and L4 have no NVLink: their all-reduces cross PCIe 4 x16.
PEER_LINK_BYTES_PER_S = {
    "h100": 450e9,
    "h200": 450e9,
    "b200": 900e9,
    "a100": 300e9,
    "a100-40gb": 300e9,
    "l40s": LINK_BYTES_PER_S["pcie4"],
    "l4": LINK_BYTES_PER_S["pcie4"],
    "mi300x": 448e9,
}


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float | None  # as the runtime reports it; None: the CPU backend
    bf16_flops: float | None  # dense peak; None where no figure stands for the device
    hbm_bytes_per_s: float | None
    link: str | None  # host link, for swap and offload
    platform: str  # which vLLM platform rules apply (kvplan.PLATFORMS)
    batched_tokens: int  # vLLM's API-server default max_num_batched_tokens on this device
    fp8_flops: float | None = None  # dense fp8 peak where the card computes in fp8
    fp4_flops: float | None = None  # dense fp4 peak (Blackwell, MI355X)


# Memory: what the runtime reports (torch.cuda.mem_get_info's total), of which vLLM's
# --gpu-memory-utilization is a share; the data sheets' "80 GB" and "141 GB" are smaller. vLLM's
# own log says `total_gpu_memory (79.11GiB)` to `(79.22GiB)` on H100 80GB HBM3 (vllm#10511,
# #11550 and others) and (79.25GiB) on A100-SXM4-80GB: 85.0e9 and 85.1e9 bytes; an H200 about
# 139.8 GiB. The others are their nvidia-smi totals less the same ~0.4 GiB (docs/twin.md).
GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("h100", 85.0e9, 989e12, 3.35e12, "pcie5", "cuda-hopper", 8192, 1979e12),
        GpuSpec("h200", 150.1e9, 989e12, 4.8e12, "pcie5", "cuda-hopper", 8192, 1979e12),
        GpuSpec("b200", 191.5e9, 2.25e15, 8.0e12, "pcie6", "cuda-blackwell", 16384, 4.5e15, 9e15),
        GpuSpec("a100-40gb", 42.3e9, 312e12, 1.555e12, "pcie4", "cuda", 2048),
        GpuSpec("a100", 85.1e9, 312e12, 2.039e12, "pcie4", "cuda", 2048),
        GpuSpec("l40s", 47.8e9, 362e12, 864e9, "pcie4", "cuda", 2048, 733e12),
        GpuSpec("l4", 23.7e9, 121e12, 300e9, "pcie4", "cuda", 2048, 242e12),
        GpuSpec("mi300x", 205.8e9, 1307e12, 5.3e12, "pcie5", "rocm", 16384, 2615e12),
        # vLLM's CPU backend: its block rules, no async scheduling; what the CPU can do
        # decides the SSM state dtype and whether fp8 KV is allowed (kvplan.PLATFORMS)
        GpuSpec("cpu", None, None, None, None, "cpu", 2048),  # x86 with AVX-512 BF16
        GpuSpec("cpu-amx", None, None, None, None, "cpu-amx", 2048),  # and AMX
        GpuSpec("cpu-avx512", None, None, None, None, "cpu-avx512", 2048),
        GpuSpec("cpu-avx2", None, None, None, None, "cpu-avx2", 2048),
    )
}
GPU_ALIASES = {"a100-80gb": "a100", "h100-sxm": "h100"}
