"""KV sizing, pure: vLLM's own KV cache arithmetic and the advice built on it.

A model's KV shape from its config.json (archconfig), named models and GPUs (presets), vLLM's
planning of groups, blocks and capacity (kvplan), what a preemption costs (kvmath), the flags
each vLLM release has (levers), and the advice that turns an observed load into a setting
(advice). No I/O beyond reading a config file (tests/test_house.py holds it: no socket, child
process, database or thread); vLLM's own layer specs come from kvwatch/local's child process. No
import of the rest of kvwatch but the ground floor (kvwatch.local, kvwatch.common): `kvwatch
advise`, the what-if, the report, the demo, `loadgen search` and the sidecar's growth rate all
use it."""

from __future__ import annotations

__all__: list[str] = []
