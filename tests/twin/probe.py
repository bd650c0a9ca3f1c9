"""vLLM's own KV planning on the twin, for several configurations in one process, no server.

`python -m tests.twin.probe CASES_JSON` builds each case's engine config as `vllm serve` would
(`EngineArgs.create_engine_config`, API-server defaults) and starts vLLM's `EngineCore` on the
twin's platform and worker: the same `_initialize_kv_caches` a served twin runs, which prints
the capacity line and sets `cache_config`. One JSON line per case follows its log lines.
`run_probe` is the caller's side (tests/twin/test_capacity.py, bench/bench_twin_capacity.py),
which never imports vLLM into its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

MARK = "KVWATCH-TWIN-PROBE "
ROOT = Path(__file__).resolve().parents[2]


def run_probe(cases: list[dict[str, Any]], timeout_s: float = 600) -> dict[str, dict[str, Any]]:
    """case id -> vLLM's figures (or its refusal as `error`), with the capacity line it logged."""
    from kvwatch.local.vllm_builder import offline_vllm_env

    env = offline_vllm_env()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.twin.probe", json.dumps(cases)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    found: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        if line.startswith(MARK):
            item = json.loads(line[len(MARK) :])
            found[item.pop("case")] = item
    if len(found) != len(cases):
        raise RuntimeError(f"the probe answered {len(found)} of {len(cases)} cases:\n{out[-4000:]}")
    return found


def _case(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.core.kv_cache_utils import _kv_cache_device_name
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from kvwatch.twin.modeldir import EOS_ID, twin_model_dir
    from kvwatch.twin.settings import ENV_VAR, TwinSettings

    served = twin_model_dir(case["model"])
    settings = TwinSettings(
        model=case["model"],
        gpu=case["gpu"],
        tp=case.get("tp", 1),
        pp=case.get("pp", 1),
        sample_vocab=served.vocab,
        eos_token_id=EOS_ID,
    )
    os.environ[ENV_VAR] = settings.to_env()
    args = EngineArgs(model=str(served.path), dtype="bfloat16", **case.get("vllm", {}))
    config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    EngineCore(config, executor_class=UniProcExecutor, log_stats=False)
    cc = config.cache_config
    out = dict(
        num_gpu_blocks=cc.num_gpu_blocks,
        block_size=cc.block_size,
        kv_cache_size_tokens=cc.kv_cache_size_tokens,
        max_concurrency=cc.kv_cache_max_concurrency,
        max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
        max_num_seqs=config.scheduler_config.max_num_seqs,
        async_scheduling=config.scheduler_config.async_scheduling,
        # vLLM logs its line once per process (`info_once`): the same line, from its own
        # figures and device name, for every case
        capacity_line=(
            f"{_kv_cache_device_name(config)} KV cache size: {cc.kv_cache_size_tokens:,} "
            f"tokens, Maximum concurrency for {config.model_config.max_model_len:,} tokens per "
            f"request: {cc.kv_cache_max_concurrency:.2f}x"
        ),
    )
    # not core.shutdown(): its clean-up empties a CUDA cache this machine does not have
    # the next case is another model: its parallel groups (an expert group for MoE) anew
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()
    return out


def main(cases_json: str) -> None:
    cases = json.loads(cases_json)
    # vLLM resolves its platform once, at its first import: the twin must be asked for by then
    from kvwatch.twin.settings import ENV_VAR, TwinSettings

    os.environ[ENV_VAR] = TwinSettings(model=cases[0]["model"], gpu=cases[0]["gpu"]).to_env()
    for case in cases:
        try:
            result = _case(case)
        except Exception as e:  # a refusal is a fact the test checks
            traceback.print_exc()
            result = dict(error=f"{type(e).__name__}: {e}")
        print(MARK + json.dumps(dict(case=case["id"], **result)), flush=True)
    os._exit(0)  # skip the engines' slow teardown


if __name__ == "__main__":
    main(sys.argv[1])
