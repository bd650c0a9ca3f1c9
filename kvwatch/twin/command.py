"""`kvwatch twin`: the parser only; the work is in `serve.py`, imported when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import (
    fraction,
    handler,
    port_number,
    positive_finite,
    positive_int,
    seed_number,
)

__all__ = ["register", "parse_step"]

_EPILOG = """examples:
  kvwatch twin --model llama-3.1-8b --gpu h100
  kvwatch twin --model llama-3.1-70b --gpu h100 --tp 4 -- --max-num-seqs 256
  kvwatch twin --model gpt-oss-120b --gpu h200 --time-scale 4 -- --kv-cache-memory-bytes 8000000000
  kvwatch twin --model ./config.json --gpu b200 --kv-cache-dtype fp8

What is vLLM's own and what is simulated: docs/twin.md. Every figure the twin serves is
labelled (the device name says "kvwatch twin"; kvwatch_twin_* metrics on /metrics)."""


def parse_step(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step takes NAME=NUMBER, not {text!r}") from None


def register(sub: Any) -> None:
    t = sub.add_parser(
        "twin",
        help="serve a model on a simulated GPU with vLLM's own engine (no GPU needed)",
        description="Start vLLM's OpenAI server on 127.0.0.1 with the kvwatch twin: vLLM's "
        "scheduler, KV cache manager, preemption and API unchanged, the accelerator simulated "
        "(no weights, no KV tensors; each step takes the time a stated roofline model gives "
        "for the card). Prints the URL and vLLM's capacity line, and runs until Ctrl-C or "
        "SIGTERM. Arguments after '--' go to vLLM unchanged. Exit 3 if it cannot start.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--model", required=True, help="a preset (llama-3.1-8b, ...) or a config.json")
    t.add_argument(
        "--gpu", required=True, help="h100, h200, b200, a100, a100-40gb, l40s, l4, mi300x"
    )
    t.add_argument("--tp", type=positive_int, default=1, help="simulated tensor-parallel ranks (1)")
    t.add_argument("--pp", type=positive_int, default=1, help="simulated pipeline stages (1)")
    t.add_argument(
        "--kv-cache-dtype", default="auto", help="auto (the model's), fp8, ... (passed to vLLM)"
    )
    t.add_argument(
        "--time-scale",
        type=positive_finite,
        help="wall seconds per simulated second (default 1, or from --expect-tokens-per-s): "
        "raise it when this machine's CPU cannot keep up with the card",
    )
    t.add_argument(
        "--expect-tokens-per-s",
        type=positive_finite,
        metavar="N",
        help="the token rate the load will ask of the card; picks the time scale that keeps "
        "this machine's API server within what it sustains (docs/twin.md)",
    )
    t.add_argument(
        "--eos-probability",
        type=fraction,
        default=0.0,
        help="chance each sampled token ends the sequence (0: run to max_tokens)",
    )
    t.add_argument("--seed", type=seed_number, default=0, help="seed of the sampled tokens (0)")
    t.add_argument(
        "--step",
        action="append",
        default=[],
        type=parse_step,
        metavar="NAME=VALUE",
        help="override a step-time constant (repeatable): hbm_efficiency, kv_efficiency, mfu, "
        "moe_layer_s, moe_hbm_factor, moe_mfu_factor, step_overhead_s, request_overhead_s, "
        "allreduce_latency_s, allreduce_growth (docs/twin.md)",
    )
    t.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="step-time constants fitted to a real server of this card (`kvwatch calibrate`); "
        "a --step beside it wins",
    )
    t.add_argument(
        "--step-trace",
        type=Path,
        metavar="FILE",
        help="append a JSON line per engine step (when the card finished it, its prompt, "
        "recompute and preempted requests): the truth `bench/bench_stall_causes.py` holds "
        "the load generator's stall causes to",
    )
    t.add_argument("--port", type=port_number, help="port (default: a free one)")
    t.add_argument("--log", type=Path, default=Path("vllm-twin.log"), help="server log file")
    t.add_argument(
        "--start-timeout", type=positive_finite, default=300.0, help="seconds to wait (300)"
    )
    t.add_argument("vllm_args", nargs=argparse.REMAINDER, help="vLLM arguments after --")
    t.set_defaults(func=handler("kvwatch.twin.serve:run_twin"))
