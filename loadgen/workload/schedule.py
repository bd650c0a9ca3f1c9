"""Stages of a run, and the compact text form the CLI accepts for them.

A stage is a pattern held for a duration and/or a request count:

    poisson:rate=4@30s          Poisson at 4 req/s for 30 s
    gamma:rate=4,burstiness=0.5@60s
    constant:rate=2#100         100 requests at 2 req/s
    ramp:start=1,end=10@60s     linear ramp of the rate (poisson=1: Poisson arrivals;
                                burstiness=0.25: gamma gaps, cv 2)
    burst:size=8,every=12@72s   8 requests at once every 12 s
    concurrency:n=16@45s#500    16 in flight, stop at 45 s or 500 requests

A run is a list of stages (a multi-stage schedule); a sweep is a generated list, one stage per
rate or concurrency value. An optional warm-up stage comes first and is left out of the summary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.loadgen.workload.arrivals import (
    Burst,
    Concurrency,
    Constant,
    Gamma,
    Pattern,
    Poisson,
    Ramp,
)

__all__ = ["Stage", "parse_stage", "sweep_stages", "StageSpecError", "ramp_stages"]

_SPEC = re.compile(
    r"^(?P<kind>[a-z]+)(?::(?P<params>[^@#]*))?(?:@(?P<dur>[\d.]+)s?)?(?:#(?P<n>\d+))?$"
)
_PARAMS: dict[str, tuple[Callable[..., Pattern], dict[str, type[float] | type[int]]]] = {
    "constant": (Constant, {"rate": float}),
    "poisson": (Poisson, {"rate": float}),
    "gamma": (Gamma, {"rate": float, "burstiness": float}),
    "ramp": (Ramp, {"start": float, "end": float, "poisson": int, "burstiness": float}),
    "burst": (Burst, {"size": int, "every": float}),
    "concurrency": (Concurrency, {"n": int}),
}


class StageSpecError(ValueError):
    """A stage description that cannot be read; the message quotes it and says why."""


@dataclass(frozen=True)
class Stage:
    name: str
    pattern: Pattern
    duration_s: float | None = None
    count: int | None = None
    warmup: bool = False

    def __post_init__(self) -> None:
        if self.duration_s is None and self.count is None:
            raise StageSpecError(f"stage {self.name!r} needs a duration (@30s) or a count (#100)")
        if isinstance(self.pattern, Ramp) and self.duration_s is None:
            raise StageSpecError(f"ramp stage {self.name!r} needs a duration (@60s)")
        if self.duration_s is not None and self.duration_s <= 0:
            raise StageSpecError(f"stage {self.name!r}: duration must be positive")


def _pattern(kind: str, params: str, spec: str) -> Pattern:
    if kind not in _PARAMS:
        raise StageSpecError(f"{spec!r}: unknown pattern {kind!r} (one of {', '.join(_PARAMS)})")
    cls, types = _PARAMS[kind]
    values: dict[str, float | int] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or key not in types:
            raise StageSpecError(f"{spec!r}: {kind} takes {', '.join(types)}; got {item!r}")
        try:
            values[key] = types[key](raw)
        except ValueError:
            what = "a whole number" if types[key] is int else "a number"
            raise StageSpecError(f"{spec!r}: {key}={raw!r} is not {what}") from None
    try:
        return cls(**values)
    except TypeError:
        raise StageSpecError(f"{spec!r}: {kind} needs {', '.join(types)}") from None
    except ValueError as e:
        raise StageSpecError(f"{spec!r}: {e}") from None


def parse_stage(spec: str, name: str | None = None, warmup: bool = False) -> Stage:
    m = _SPEC.match(spec.strip())
    if m is None:
        raise StageSpecError(f"{spec!r}: expected KIND:key=value,...@SECONDS#COUNT")
    pattern = _pattern(m["kind"], m["params"] or "", spec)
    return Stage(
        name=name or spec.strip(),
        pattern=pattern,
        duration_s=float(m["dur"]) if m["dur"] else None,
        count=int(m["n"]) if m["n"] else None,
        warmup=warmup,
    )


def sweep_stages(kind: str, values: list[float], duration_s: float | None, count: int | None,
                 burstiness: float = 1.0) -> list[Stage]:  # fmt: skip
    """One stage per value: `kind` is rate (Poisson, or gamma with burstiness) or concurrency."""
    if not values:
        raise StageSpecError("a sweep needs at least one value")
    stages = []
    for v in values:
        if not (math.isfinite(v) and v > 0):
            raise StageSpecError(f"sweep values must be finite numbers above 0, got {v}")
        if kind == "concurrency":
            if v != int(v):
                raise StageSpecError(f"concurrency sweep values must be whole numbers, got {v}")
            pattern: Pattern = Concurrency(int(v))
            name = f"concurrency={int(v)}"
        elif kind == "rate":
            pattern = Poisson(v) if burstiness == 1.0 else Gamma(v, burstiness)
            name = f"rate={v:g}"
        else:
            raise StageSpecError(f"sweep over {kind!r}: use rate or concurrency")
        stages.append(Stage(name, pattern, duration_s, count))
    return stages


def ramp_stages(light: int, heavy: int, rounds: int) -> list[str]:
    """Healthy, then pressure, then `rounds` heavy stages: loadgen stage specs."""
    middle = max(light + 1, heavy // 3)
    stages = [f"concurrency:n={light}#{2 * light}", f"concurrency:n={middle}#{middle}"]
    return stages + [f"concurrency:n={heavy}#{heavy}"] * rounds
