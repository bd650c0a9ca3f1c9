"""The handlers of `kvwatch loadgen build-model` and `serve-local`: the tiny model a local
vLLM serves, and that server started and held until Ctrl-C (parsers: command.py)."""

from __future__ import annotations

import argparse
import signal
import sys

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError, os_error, writable_file

__all__ = ["run_build_model", "run_serve_local"]


def run_build_model(ns: argparse.Namespace) -> int:
    from kvwatch.local.tiny_model import SPECS, build_tiny_model

    try:
        print(build_tiny_model(SPECS[ns.size], cache_dir=ns.cache_dir, force=ns.force))
    except OSError as e:
        raise os_error("build the model in", e) from None
    return 0


def run_serve_local(ns: argparse.Namespace) -> int:
    from kvwatch.local.server import (
        LocalVLLM,
        ServerConfig,
        ServerStartError,
        serve_until_stopped,
    )
    from kvwatch.local.tiny_model import build_tiny_model

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
    log = writable_file(ns.log.resolve(), "the server log")
    server = LocalVLLM(config, log_path=log, start_timeout_s=ns.start_timeout)
    # SIGTERM ends the run like Ctrl-C does, so `finally` stops the server either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"starting vLLM on {config.host} (log: {server.log_path}) ...", file=sys.stderr)
    try:
        server.start()
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    try:
        serve_until_stopped(server)
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    return 0
