"""The twin's vLLM platform: CUDA's behaviour on this machine's CPU, for a named card.

It borrows the CPU platform's helpers (tensors live on the CPU, gloo for the one-process group)
but not its decisions: `check_and_update_config` keeps what CUDA keeps (16-token blocks and the
attention backends' own block rules, async scheduling, the in-process executor) and points
vLLM at the twin's worker. It reports the card's name and memory, so vLLM picks that card's
batch defaults, and a `cuda` device type, so vLLM's capacity line says "GPU" as on the card.
vLLM imports this module only when `plugin.platform_plugin` named it.
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import TYPE_CHECKING, Any

from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

from kvwatch.sizing.kvmath import lookup_gpu
from kvwatch.twin.cards import CAPABILITIES, DEVICE_NAMES
from kvwatch.twin.settings import TwinSettings, from_environment

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["TwinPlatform", "settings"]

# under vLLM's logger name: vLLM's logging setup drops other loggers' lines
logger = logging.getLogger("vllm.kvwatch_twin")


def settings() -> TwinSettings:
    found = from_environment()
    if found is None:
        raise RuntimeError("the kvwatch twin platform was loaded without KVWATCH_TWIN set")
    return found


class TwinPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    device_name: str = "cuda"
    device_type: str = "cuda"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        gpu = settings().gpu
        return f"{DEVICE_NAMES.get(gpu, gpu)} (kvwatch twin)"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        mem = lookup_gpu(settings().gpu).memory_bytes
        if mem is None:
            raise ValueError(f"{settings().gpu} is not a GPU")
        return int(mem)

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
        major, minor = CAPABILITIES.get(settings().gpu, (9, 0))
        return DeviceCapability(major=major, minor=minor)

    @classmethod
    def get_attn_backend_cls(
        cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        from vllm.config import get_current_vllm_config

        # imported here: the backends import vLLM's attention code, which needs the platform
        from kvwatch.twin.backends import attention_backend

        cache = get_current_vllm_config().cache_config
        return attention_backend(
            lookup_gpu(settings().gpu).platform,
            bool(attn_selector_config.use_mla),
            attn_selector_config.kv_cache_dtype,
            bool(cache.user_specified_block_size),
        )

    @classmethod
    def current_device(cls) -> Any:
        # layers that place a small tensor on "the" device at build time (GDN's gated norm)
        import torch

        return torch.device("cpu")

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        s = settings()
        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            raise ValueError(
                "the kvwatch twin runs as one process: give the simulated --tp and --pp to "
                "`kvwatch twin`, not to vLLM"
            )
        if vllm_config.speculative_config is not None:
            raise ValueError("the kvwatch twin does not simulate speculative decoding")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "kvwatch.twin.worker.TwinWorker"
        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        if multiprocessing.parent_process() is None:
            logger.info(
                "kvwatch twin: simulating %s x%d (TP %d, PP %d), time scale %g: every "
                "simulated second takes %g wall seconds",
                cls.get_device_name(),
                s.tp * s.pp,
                s.tp,
                s.pp,
                s.time_scale,
                s.time_scale,
            )

    @classmethod
    def update_block_size_for_backend(cls, vllm_config: VllmConfig) -> None:
        # the generic rule (the backends' block sizes), not the CPU platform's hybrid-only one
        Platform.update_block_size_for_backend.__func__(cls, vllm_config)  # type: ignore[attr-defined]


def _export_status() -> None:
    """In the API server's process, the twin's own metrics beside vLLM's on /metrics."""
    s = from_environment()
    if s is None or multiprocessing.parent_process() is not None:
        return
    from kvwatch.twin.exporter import register

    register(s)


_export_status()
