"""What a failed vLLM start is said to have died of: the exception's own line, not the
traceback's source line that raised it (a real vLLM 0.32 log's last lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.local.server import LocalVLLM, ServerConfig, ServerStartError, last_error

TAIL = """\
(EngineCore pid=24284) ERROR 12-06 10:09:30 [core.py:1510] ValueError: To serve at least one \
request with the model's max seq len (16384), (2.0 GiB KV cache is needed, which is larger than \
the available KV cache memory (2.0 GiB).
Traceback (most recent call last):
  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1431, in \
wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_engines_own_error_is_named_not_the_raise_that_reported_it() -> None:
    said = last_error(TAIL)
    assert said is not None and said.startswith("ValueError: To serve at least one request")


def test_a_tail_without_an_exception_names_none() -> None:
    assert last_error("INFO started\n    raise RuntimeError(\n") is None


def test_a_servers_zmq_sockets_live_in_a_folder_its_stop_removes(tmp_path: Path) -> None:
    """vLLM makes its ZMQ sockets in the temp folder (VLLM_RPC_BASE_PATH) and a killed server
    leaves them: 450 were left in /tmp by a day of tests. Each start gets a folder of its own
    and stop removes it, here after a start that failed (the "Python" is a script that makes a
    socket file where vLLM would and exits), and a caller's own choice is kept."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (model / name).write_text("{}")
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    where = "$VLLM_RPC_BASE_PATH"
    python.write_text(f'#!/bin/sh\necho "{where}" > {seen}\ntouch "{where}/sock"\n')
    python.chmod(0o755)
    for env in ({}, {"VLLM_RPC_BASE_PATH": str(tmp_path / "mine")}):
        (tmp_path / "mine").mkdir(exist_ok=True)
        config = ServerConfig(model=model, python=str(python), weightless=True, env=env)
        server = LocalVLLM(config, log_path=tmp_path / "vllm.log", start_timeout_s=10)
        with pytest.raises(ServerStartError, match="exited with code 0"):
            server.start()
        used = Path(seen.read_text().strip())
        if env:
            assert used == tmp_path / "mine" and (used / "sock").exists()  # the caller's
        else:
            assert used.name.startswith("kvwatch-rpc-") and not used.exists()
