"""`kvwatch loadgen ...`: the load generator and the local target it drives."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kvwatch.loadgen.cmd_run import register_run

from kvwatch.command import EXIT_UNREACHABLE, CliError

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("loadgen", help="drive a vLLM server and record what each request saw")
    lsub = p.add_subparsers(dest="loadgen_command", required=True, metavar="SUBCOMMAND")

    b = lsub.add_parser(
        "build-model",
        help="build the tiny local Llama (random weights, local tokenizer) used by tests and demo",
        description="Build the tiny ~30M-parameter Llama into the cache directory "
        "($KVWATCH_CACHE or ~/.cache/kvwatch) and print its path. Reuses a complete earlier build.",
    )
    b.add_argument("--cache-dir", type=Path, help="where models are kept")
    b.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    b.add_argument(
        "--size",
        choices=["tiny", "small"],
        default="tiny",
        help="tiny: 30M parameters (tests, demo); small: 200M, compute-bound on CPU",
    )
    b.set_defaults(func=_build_model)

    s = lsub.add_parser(
        "serve-local",
        help="start a local vLLM OpenAI server (CPU or GPU) and keep it running until stopped",
        description="Start a vLLM OpenAI-compatible server on 127.0.0.1 with a chosen KV cache "
        "budget, print its base URL and log path, and run until Ctrl-C or SIGTERM. Arguments after "
        "'--' go to vLLM unchanged (e.g. -- --max-num-seqs 8).",
    )
    s.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    s.add_argument("--port", type=int, help="port (default: a free one)")
    s.add_argument(
        "--kv-cache-bytes", type=int, default=10 * 1024 * 1024,
        help="KV cache budget in bytes, passed as --kv-cache-memory-bytes (default: 10 MiB, "
        "40 blocks of 32 tokens with the tiny model)",
    )  # fmt: skip
    s.add_argument("--block-size", type=int, default=32, help="KV block size (CPU: multiple of 32)")
    s.add_argument("--max-model-len", type=int, default=1024)
    s.add_argument("--log", type=Path, default=Path("vllm-server.log"), help="server log file")
    s.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for /health")
    s.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra vLLM arguments after --")
    s.set_defaults(func=_serve_local)

    register_run(lsub)


def _build_model(ns: argparse.Namespace) -> int:
    from kvwatch.loadgen.tiny_model import SPECS, build_tiny_model

    print(build_tiny_model(SPECS[ns.size], cache_dir=ns.cache_dir, force=ns.force))
    return 0


def _serve_local(ns: argparse.Namespace) -> int:
    from kvwatch.loadgen.local_server import LocalVLLM, ServerConfig, ServerStartError
    from kvwatch.loadgen.tiny_model import build_tiny_model

    extra = [a for a in ns.vllm_args if a != "--"] if ns.vllm_args else []
    model = ns.model or build_tiny_model()
    config = ServerConfig(
        model=model,
        kv_cache_memory_bytes=ns.kv_cache_bytes,
        block_size=ns.block_size,
        max_model_len=ns.max_model_len,
        port=ns.port,
        extra_args=tuple(extra),
    )
    server = LocalVLLM(config, log_path=ns.log.resolve(), start_timeout_s=ns.start_timeout)
    # SIGTERM ends the run like Ctrl-C does, so `finally` stops the server either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"starting vLLM on {config.host} (log: {server.log_path}) ...", file=sys.stderr)
    try:
        server.start()
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    try:
        print(f"base_url={server.base_url}")
        print(f"log={server.log_path}")
        print(f"pid={server.pid}", flush=True)
        while True:
            time.sleep(0.5)
            if server.proc is not None and server.proc.poll() is not None:
                raise CliError(
                    f"vLLM exited with code {server.proc.returncode}; see {server.log_path}",
                    EXIT_UNREACHABLE,
                )
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping vLLM ...", file=sys.stderr)
        server.stop()
    return 0
