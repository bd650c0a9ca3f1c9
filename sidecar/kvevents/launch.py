"""`kvwatch sidecar --kv-events auto -- vllm serve ...`: the sidecar that starts vLLM turns its
KV events on and follows them, so an operator need not choose endpoints.

Without `--kv-events-config` in the command, it adds one that publishes on Unix sockets in a
private directory (nothing listens on the network; vLLM binds a tcp endpoint on every
interface). With one already there, it follows what that names: a wildcard tcp bind
(`tcp://*:5557`) is followed on 127.0.0.1. Pure: the caller makes the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["AUTO", "events_for_command"]

AUTO = "auto"
_FLAG = "--kv-events-config"


def _local(endpoint: str) -> str:
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


def _given(command: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(command):
        if arg == _FLAG and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(_FLAG + "="):
            return arg.split("=", 1)[1]
    return None


def events_for_command(
    command: tuple[str, ...], private_dir: Path
) -> tuple[tuple[str, ...], str, str | None]:
    """The command to start (with the flag added where it had none), the endpoint to follow
    and its replay endpoint. ValueError, one line, for a command whose flag turns events off
    or publishes where the sidecar cannot follow."""
    given = _given(command)
    if given is None:
        events, replay = (
            f"ipc://{private_dir}/kv-events.sock",
            f"ipc://{private_dir}/kv-replay.sock",
        )
        ours = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events,
                "replay_endpoint": replay}  # fmt: skip
        return (*command, _FLAG, json.dumps(ours)), events, replay
    try:
        config = json.loads(given)
    except ValueError:
        raise ValueError(f"{_FLAG} in the command is not JSON") from None
    if not isinstance(config, dict) or config.get("enable_kv_cache_events") is not True:
        raise ValueError(f"{_FLAG} in the command does not enable KV cache events")
    if config.get("publisher", "zmq") != "zmq":
        raise ValueError(f"{_FLAG} in the command publishes with {config.get('publisher')!r}")
    endpoint, again = config.get("endpoint", "tcp://*:5557"), config.get("replay_endpoint")
    if not isinstance(endpoint, str) or not (again is None or isinstance(again, str)):
        raise ValueError(f"{_FLAG} in the command has an endpoint that is not text")
    return command, _local(endpoint), None if again is None else _local(again)
