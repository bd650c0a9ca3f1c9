"""What a failed vLLM start is said to have died of: the exception's own line, not the
traceback's source line that raised it (a real vLLM 0.32 log's last lines)."""

from __future__ import annotations

from kvwatch.local.server import last_error

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
