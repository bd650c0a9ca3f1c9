"""vLLM itself as the oracle for kvwatch's KV arithmetic: its offline engine on dummy weights.

`python -m tests.sizing.oracle CONFIG_DIR SETTINGS_JSON` starts `vllm.LLM` on the config with
`load_format="dummy"` (no weights, no tokenizer; about 15 s here), and prints one JSON line:
vLLM's own num_gpu_blocks, block_size, kv_cache_size_tokens and max_concurrency (the caller
adds the "KV cache size" line from the log), or the error with which vLLM refused the config.
`run_oracle` is the caller's side: the test never imports vLLM into its own process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OracleResult", "run_oracle", "CAPACITY_LINE"]

ROOT = Path(__file__).resolve().parents[2]
CAPACITY_LINE = re.compile(
    r"[A-Z]+ KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
    r"([\d.]+)x"
)
_MARK = "KVWATCH-ORACLE "


@dataclass(frozen=True)
class OracleResult:
    num_gpu_blocks: int | None
    block_size: int | None
    kv_cache_size_tokens: int | None
    max_concurrency: float | None
    capacity_line: str | None
    error: str | None


def run_oracle(
    config_dir: Path, settings: dict[str, object], timeout_s: float = 300
) -> OracleResult:
    from kvwatch.local.vllm_builder import offline_vllm_env

    env = offline_vllm_env()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sizing.oracle", str(config_dir), json.dumps(settings)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    out = proc.stdout + proc.stderr
    capacity = CAPACITY_LINE.search(out)
    for line in out.splitlines():
        if line.startswith(_MARK):
            found = json.loads(line[len(_MARK) :])
            found["capacity_line"] = capacity.group(0) if capacity else None
            return OracleResult(**found)
    raise RuntimeError(f"the oracle for {config_dir} printed no result:\n{out[-3000:]}")


def _main(config_dir: str, settings_json: str) -> None:
    from vllm import LLM

    settings = json.loads(settings_json)
    try:
        llm = LLM(
            model=config_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            seed=0,
            **settings,
        )
    except Exception as e:  # vLLM's refusal is a fact the test checks
        print(
            _MARK
            + json.dumps(
                dict(
                    num_gpu_blocks=None,
                    block_size=None,
                    kv_cache_size_tokens=None,
                    max_concurrency=None,
                    capacity_line=None,
                    error=f"{type(e).__name__}: {e}",
                )
            )
        )
        return
    cc = llm.llm_engine.vllm_config.cache_config
    print(
        _MARK
        + json.dumps(
            dict(
                num_gpu_blocks=cc.num_gpu_blocks,
                block_size=cc.block_size,
                kv_cache_size_tokens=cc.kv_cache_size_tokens,
                max_concurrency=cc.kv_cache_max_concurrency,
                capacity_line=None,
                error=None,
            )
        ),
        flush=True,
    )
    os._exit(0)  # skip the engine's slow teardown; nothing is left to flush


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
