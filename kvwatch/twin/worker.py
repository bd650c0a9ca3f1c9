"""The twin's vLLM worker: no weights, no KV tensors; each step's tokens when the card is done.

vLLM's engine (scheduler, KV cache manager, preemption, prefix cache, API server) runs unchanged
and calls this worker as it calls a GPU worker:

- `load_model` builds vLLM's own model class on the meta device (as vLLM's weight-cache loader
  does), so its attention layers give the KV specs a real card would get, with no memory;
- `get_kv_cache_spec` reads them as vLLM's GPU model runner does, then stands in for the
  simulated TP/PP: KV heads per rank (at least one), the first stage's layers;
- `determine_available_memory` is `--kv-cache-memory-bytes`, or the card's memory share less
  the weights and an activation estimate (`kvwatch/sizing/budget.py`);
- `execute_model`/`sample_tokens` sample a token for every request whose prompt is all computed
  (as the GPU runner does, from the scheduler's own counts) and hand back the output when the
  simulated card would finish (`steptime.py`, `card.py`): a future under async scheduling, so
  the engine overlaps the next step's scheduling with this one, as on a GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from kvwatch.loadgen.results.step_trace import StepRecord, StepTraceWriter
from kvwatch.sizing.budget import default_max_num_seqs, utilization_budget
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.steptime import ScheduledRequest, StepConstants, StepModel
from kvwatch.twin.card import CardClock
from kvwatch.twin.platform import settings
from kvwatch.twin.status import write_status

__all__ = ["TwinWorker"]

logger = logging.getLogger("vllm.kvwatch_twin")
_BEHIND_WARN = 0.10  # a card idle this share of an interval with work waiting is not keeping time


class _Ready(AsyncModelRunnerOutput):
    """A step's output that is ready when the simulated card finishes the step."""

    def __init__(self, output: ModelRunnerOutput, ready_at: float) -> None:
        self._output = output
        self._ready_at = ready_at

    def get_output(self) -> ModelRunnerOutput:
        delay = self._ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return self._output


class TwinWorker(WorkerBase):
    def __init__(
        self,
        vllm_config: Any,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
        **_: Any,
    ) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.settings = settings()
        self.model: torch.nn.Module | None = None
        self._prompt_len: dict[str, int] = {}
        self._admitted: dict[str, int] = {}  # request -> its admission number, for the victims
        self._out: set[str] = set()  # preempted, not resumed yet
        self._recomputing: set[str] = set()  # resumed, not sampling again yet
        self._admissions = 0
        self._previous: set[str] = set()
        self._pending: tuple[ModelRunnerOutput, float] | None = None
        self._rng = np.random.default_rng(self.settings.seed)
        self._card = CardClock(self.settings.time_scale, time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reporter: threading.Thread | None = None
        path = self.settings.step_trace_path
        self._trace = StepTraceWriter(Path(path)) if path and self.rank == 0 else None
        arch = resolve_model(self.settings.model)
        self._gpu = lookup_gpu(self.settings.gpu)
        self._arch = arch
        self._steps = StepModel(
            arch,
            self._gpu,
            self.settings.tp,
            self.settings.pp,
            str(self.cache_config.cache_dtype),
            StepConstants.with_overrides(self.settings.step),
        )

    # -- set-up -----------------------------------------------------------------------------

    def init_device(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

        self.device = torch.device("cpu")
        # under the config, as vLLM's workers do: MoE models get their expert-parallel group
        with set_current_vllm_config(self.vllm_config):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=self.distributed_init_method,
                local_rank=0,
                backend="gloo",
            )
            ensure_model_parallel_initialized(1, 1)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype

        try:
            with set_default_torch_dtype(self.model_config.dtype), torch.device("meta"):
                self.model = initialize_model(vllm_config=self.vllm_config)
        except Exception as e:
            # every kvwatch preset builds (tests/twin/test_capacity.py); a config whose layers
            # need kernels this CPU build lacks cannot give vLLM's own specs: say so plainly
            arch = self.model_config.architectures
            raise RuntimeError(
                f"kvwatch twin: vLLM cannot build {arch} on the meta device in this build "
                f"({type(e).__name__}: {e}); `kvwatch advise --what-if` still sizes it"
            ) from e
        logger.info(
            "kvwatch twin: built %s on the meta device (no weights); step time: %s",
            type(self.model).__name__,
            ", ".join(f"{k}={v:g}" for k, v in self._steps.describe().items() if _num(v)),
        )

    def get_model(self) -> torch.nn.Module:
        assert self.model is not None
        return self.model

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_kv_cache_spec(self) -> dict[str, Any]:
        from vllm.config.vllm import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention import Attention
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

        from kvwatch.twin.ranks import per_rank

        specs: dict[str, Any] = {}
        layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase)  # type: ignore[type-abstract]
        for name, module in layers.items():
            if isinstance(module, Attention) and module.kv_sharing_target_layer_name:
                continue
            spec = module.get_kv_cache_spec(self.vllm_config)
            if spec is None:
                continue
            if isinstance(spec, AttentionSpec):
                from vllm.v1.worker.utils import customize_attention_spec

                spec = customize_attention_spec(module.get_attn_backend(), spec)
            specs[name] = spec
        return per_rank(specs, self.settings.tp, self.settings.pp, MLAAttentionSpec)

    def determine_available_memory(self) -> int:
        given = self.cache_config.kv_cache_memory_bytes
        if given:
            return int(given)
        sched = self.scheduler_config
        b = utilization_budget(
            self._arch,
            self._gpu,
            self.cache_config.gpu_memory_utilization,
            self.settings.tp,
            self.settings.pp,
            sched.max_num_batched_tokens or self._gpu.batched_tokens,
            sched.max_num_seqs or default_max_num_seqs(self._gpu),
        )
        logger.info("kvwatch twin: KV budget %s bytes = %s", f"{b.kv_bytes:,}", b.how)
        return b.kv_bytes

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        logger.info(
            "kvwatch twin: %d KV blocks, no KV tensors allocated", kv_cache_config.num_blocks
        )

    def compile_or_warm_up_model(self) -> CompilationTimes:
        self._reporter = threading.Thread(target=self._report_loop, name="twin-card", daemon=True)
        self._reporter.start()
        return CompilationTimes(0.0, 0.0)

    def check_health(self) -> None:
        reporter = self._reporter
        if reporter is not None and not reporter.is_alive() and not self._stop.is_set():
            raise RuntimeError("the kvwatch twin's card reporter stopped")

    def shutdown(self) -> None:
        self._stop.set()
        if self._trace is not None:
            self._trace.close()

    # -- steps ------------------------------------------------------------------------------

    def execute_model(self, scheduler_output: Any) -> ModelRunnerOutput | None:
        so = scheduler_output
        for rid in so.finished_req_ids:
            self._prompt_len.pop(rid, None)
            self._admitted.pop(rid, None)
            self._out.discard(rid)
            self._recomputing.discard(rid)
        preempted = set(so.preempted_req_ids or ())
        if preempted:
            self._log_preemptions(preempted)
            self._recomputing -= preempted
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        batch: list[ScheduledRequest] = []
        req_ids: list[str] = []
        sample: list[bool] = []
        prefill = recompute = 0
        for new in so.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids or ()) or int(new.prompt_embeds.shape[0])
            self._prompt_len[new.req_id] = prompt
            self._admitted[new.req_id] = self._admissions
            self._admissions += 1
            n = so.num_scheduled_tokens[new.req_id]
            done = new.num_computed_tokens + n
            req_ids.append(new.req_id)
            batch.append(ScheduledRequest(n, done))
            sample.append(done >= prompt)
            prefill += n
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            n = so.num_scheduled_tokens[rid]
            if rid in cached.resumed_req_ids:
                self._out.discard(rid)
                self._recomputing.add(rid)
                logger.info(
                    "kvwatch twin: resumed %s: %d tokens recomputed in this step, %d found in "
                    "the prefix cache, of its %d",
                    rid,
                    n,
                    cached.num_computed_tokens[i],
                    self._prompt_len[rid] + cached.num_output_tokens[i],
                )
            done = cached.num_computed_tokens[i] + n
            req_ids.append(rid)
            batch.append(ScheduledRequest(n, done))
            known = self._prompt_len[rid] + cached.num_output_tokens[i]
            sample.append(done >= known)
            if rid in self._recomputing:
                recompute += n
                if done >= known:
                    self._recomputing.discard(rid)
            else:  # a prompt's later chunk; a decode step's one token is not a prompt's
                prefill += max(0, min(n, self._prompt_len[rid] - (done - n)))
        s = self.settings
        tokens = self._rng.integers(s.first_sample_id, s.sample_vocab, len(req_ids))
        if s.eos_probability > 0:
            tokens[self._rng.random(len(req_ids)) < s.eos_probability] = s.eos_token_id
        sampled = [[int(t)] if ok else [] for t, ok in zip(tokens.tolist(), sample, strict=True)]
        output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        ids = set(req_ids)
        continuing = not ids.isdisjoint(self._previous)
        skipped = self._previous - ids - preempted - set(so.finished_req_ids)
        self._previous = ids
        simulated = self._steps.seconds(batch)
        now = time.monotonic()
        with self._lock:
            ready = self._card.submit(simulated, now, continuing)
        if self._trace is not None and not self._trace.write(
            StepRecord(
                end=time.time() + (ready - now),
                card_s=simulated * s.time_scale,
                requests=len(req_ids),
                prefill=prefill,
                recompute=recompute,
                preempted=tuple(sorted(preempted)),
                resumed=tuple(sorted(cached.resumed_req_ids)),
                skipped=tuple(sorted(skipped)),
            )
        ):
            logger.warning("kvwatch twin: the step trace stopped: %s", self._trace.error)
            self._trace = None
        self._pending = (output, ready)
        return None

    def _log_preemptions(self, victims: set[str]) -> None:
        """vLLM 0.32 logs no line per preemption (docs/log-formats.md); the twin sees each one
        and says which request went, against the newest running one (FCFS takes the newest)."""
        running = (n for r, n in self._admitted.items() if r not in self._out or r in victims)
        newest = max(running, default=-1)
        self._out |= victims
        for rid in sorted(victims, key=lambda r: -self._admitted.get(r, -1)):
            logger.info(
                "kvwatch twin: preempted %s (admitted #%d; the newest running request was "
                "admitted #%d)",
                rid,
                self._admitted.get(rid, -1),
                newest,
            )

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        assert self._pending is not None, "sample_tokens without a step"
        output, ready = self._pending
        self._pending = None
        result = _Ready(output, ready)
        if self.scheduler_config.async_scheduling:
            return result
        return result.get_output()

    def add_lora(self, lora_request: Any) -> bool:
        raise ValueError("the kvwatch twin does not simulate LoRA adapters")

    # -- the card's status ------------------------------------------------------------------

    def _report_loop(self) -> None:
        s = self.settings
        path = Path(s.status_path) if s.status_path else None
        while not self._stop.wait(s.status_interval_s):
            try:
                with self._lock:
                    st = self._card.status(time.monotonic())
                if path is not None:
                    write_status(path, st)
                if st.steps:
                    log = logger.warning if st.behind_share > _BEHIND_WARN else logger.info
                    log(
                        "kvwatch twin: card busy %.0f%%, idle with work waiting %.0f%% over "
                        "%.1f s (time scale %g)%s",
                        100 * st.busy_share,
                        100 * st.behind_share,
                        st.interval_s,
                        st.time_scale,
                        "; this machine's CPU is not keeping up: latencies are not the "
                        "card's; raise the time scale"
                        if st.behind_share > _BEHIND_WARN
                        else "",
                    )
            except Exception:  # the loop must outlive a bad interval: say so and go on
                logger.exception("kvwatch twin: the card status could not be written")


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
