"""What the twin is asked to simulate, passed from `kvwatch twin` to vLLM's processes.

The settings travel as JSON in the `KVWATCH_TWIN` environment variable: vLLM spawns its engine
process itself, and the environment is the one channel every process it starts inherits. The
variable being set is also what turns the platform plugin on.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

__all__ = ["ENV_VAR", "TwinSettings", "SettingsError", "from_environment"]

ENV_VAR = "KVWATCH_TWIN"


class SettingsError(ValueError):
    """The twin's settings are missing or malformed; the message says which."""


@dataclass(frozen=True)
class TwinSettings:
    model: str  # a kvwatch preset name or a config.json path (step time and the fallback plan)
    gpu: str  # a GPU preset (kvwatch/sizing/presets.py)
    tp: int = 1  # simulated tensor-parallel ranks: the KV per rank and the step time of a group
    pp: int = 1  # simulated pipeline stages: the layers per stage
    time_scale: float = 1.0  # every simulated duration is stretched by this factor in wall time
    eos_probability: float = 0.0  # chance that a sampled token is the end of sequence
    sample_vocab: int = 4096  # ids the served tokenizer has: sampled ids stay below it
    first_sample_id: int = 3  # the tokenizer's special tokens come first; never sampled
    eos_token_id: int = 1
    seed: int = 0
    status_path: str | None = None  # where the worker writes its busy share and lag
    status_interval_s: float = 5.0
    step_trace_path: str | None = None  # where the worker writes each step (`--step-trace`)
    step: dict[str, float] = field(default_factory=dict)  # step-time constants overridden

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1:
            raise SettingsError("tp and pp must be at least 1")
        if not self.time_scale > 0:
            raise SettingsError(f"the time scale must be positive, not {self.time_scale}")
        if not 0 <= self.eos_probability <= 1:
            raise SettingsError("the EOS probability must be in [0, 1]")
        if self.sample_vocab <= self.first_sample_id:
            raise SettingsError("the sampled vocabulary is empty")
        if self.status_interval_s <= 0:
            raise SettingsError("the status interval must be positive")

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TwinSettings:
        try:
            raw: Any = json.loads(text)
        except ValueError as e:
            raise SettingsError(f"{ENV_VAR} is not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise SettingsError(f"{ENV_VAR} must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SettingsError(f"{ENV_VAR} has unknown fields: {', '.join(unknown)}")
        try:
            return cls(**raw)
        except TypeError as e:
            raise SettingsError(f"{ENV_VAR}: {e}") from None


def from_environment() -> TwinSettings | None:
    """The settings if the twin was asked for in this process's environment, else None (vLLM
    asks the platform for them once per attention layer: parsed once per value)."""
    text = os.environ.get(ENV_VAR)
    return _parsed(text) if text else None


@lru_cache(maxsize=4)
def _parsed(text: str) -> TwinSettings:
    return TwinSettings.from_json(text)
