"""`--kv-events auto` with the vLLM command: the flag added, or the command's own followed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.sidecar.kvevents.launch import events_for_command

SERVE = ("vllm", "serve", "m", "--port", "8000")


def test_the_flag_is_added_on_private_sockets(tmp_path: Path) -> None:
    cmd, events, replay = events_for_command(SERVE, tmp_path)
    assert cmd[:5] == SERVE and cmd[5] == "--kv-events-config"
    config = json.loads(cmd[6])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": events, "replay_endpoint": replay}  # fmt: skip
    assert events == f"ipc://{tmp_path}/kv-events.sock"


@pytest.mark.parametrize(
    ("given", "events", "replay"),
    [
        ('{"enable_kv_cache_events": true}', "tcp://127.0.0.1:5557", None),
        (
            '{"enable_kv_cache_events": true, "endpoint": "tcp://0.0.0.0:7000", '
            '"replay_endpoint": "tcp://*:7001"}',
            "tcp://127.0.0.1:7000",
            "tcp://127.0.0.1:7001",
        ),
        ('{"enable_kv_cache_events": true, "endpoint": "ipc:///run/kv"}', "ipc:///run/kv", None),
    ],
)
def test_the_commands_own_config_is_followed(
    tmp_path: Path, given: str, events: str, replay: str | None
) -> None:
    for cmd in ((*SERVE, "--kv-events-config", given), (*SERVE, f"--kv-events-config={given}")):
        assert events_for_command(cmd, tmp_path) == (cmd, events, replay)


@pytest.mark.parametrize(
    "given",
    ["{", "[]", '{"enable_kv_cache_events": false}',
     '{"enable_kv_cache_events": true, "publisher": "null"}',
     '{"enable_kv_cache_events": true, "endpoint": 5}'],
)  # fmt: skip
def test_a_config_it_cannot_follow_is_one_line(tmp_path: Path, given: str) -> None:
    with pytest.raises(ValueError, match="--kv-events-config in the command"):
        events_for_command((*SERVE, "--kv-events-config", given), tmp_path)
