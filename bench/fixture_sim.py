"""A block-by-block model of a vLLM v1 engine's KV cache under load, for the forecast benches.

vLLM admits a waiting request when its prompt's blocks are free; every running request grows
one token a step and takes a new block every `block_tokens`; the cache is out when a step finds
no block free (vLLM preempts there) or every block is in use (KV usage 100%, which is how
bench_forecast.py reads the truth). Time moves in steps of the server's step time, jumping over
the steps where nothing changes: a block boundary, a finish, a send.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FIXTURE", "SCRAPE_S", "SEGMENT_S", "Shape", "Speeds", "Engine", "run_until_out"]

SEGMENT_S = 5.0  # the server's speed holds this long, then changes
SCRAPE_S = 0.5


@dataclass(frozen=True)
class Shape:
    """The cache and the requests: usable blocks (vLLM's null block left out), tokens a block,
    and every request's prompt and output tokens."""

    blocks: int
    block_tokens: int
    prompt: int
    output: int

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)


FIXTURE = Shape(blocks=39, block_tokens=32, prompt=30, output=300)  # 40 blocks, 30 + 300 tokens


@dataclass(frozen=True)
class Speeds:
    """The server's speed: each run's typical step time, and how far a 5 s span strays from its
    run's (a share)."""

    per_run: list[float]
    deviations: list[float]

    def draw_run(self, rng: random.Random) -> float:
        return rng.choice(self.per_run)

    def draw_span(self, rng: random.Random, typical: float) -> float:
        return typical * (1.0 + rng.choice(self.deviations))


@dataclass
class Engine:
    """The cache's state: tokens each running request holds, sends not yet admitted."""

    shape: Shape = FIXTURE
    t: float = 0.0
    running: list[int] = field(default_factory=list)
    waiting: int = 0
    sends: list[float] = field(default_factory=list)  # the sends to come, in time order
    sent: int = 0  # how many of them have been sent
    typical_step_s: float = 0.012  # this run's server speed
    step_s: float = 0.012  # this span's
    segment_end: float = 0.0
    admitted: int = 0  # requests admitted so far: vLLM's prompt tokens counter over the prompt
    generated: int = 0  # tokens generated so far: vLLM's generation tokens counter

    def copy(self, at: float | None = None) -> Engine:
        """A copy; `at`: as it stands then, within a stretch where nothing but growth happens."""
        k = 0 if at is None else int((at - self.t) / self.step_s)
        return Engine(
            self.shape, self.t if at is None else at, [n + k for n in self.running],
            self.waiting, self.sends[self.sent :], 0, self.typical_step_s, self.step_s,
            self.segment_end, self.admitted, self.generated + k * len(self.running),
        )  # fmt: skip


def run_until_out(
    e: Engine,
    rng: random.Random,
    speeds: Speeds,
    scrape: Callable[[float, Engine], None] | None = None,
    until: float = 200.0,
) -> float:
    """Advance `e` until the cache runs out; the time it did (or `until`). `scrape(t, e)` is
    called every SCRAPE_S."""
    sh = e.shape
    done = sh.prompt + sh.output
    next_scrape = math.ceil(e.t / SCRAPE_S) * SCRAPE_S if scrape else math.inf
    while e.t < until:
        if e.t >= e.segment_end:
            e.step_s = speeds.draw_span(rng, e.typical_step_s)
            e.segment_end = e.t + SEGMENT_S
        while e.sent < len(e.sends) and e.sends[e.sent] <= e.t:
            e.waiting += 1
            e.sent += 1
        used = sum(sh.blocks_for(n) for n in e.running)
        while e.waiting and used + sh.blocks_for(sh.prompt) <= sh.blocks:  # the prompt fits
            e.waiting -= 1
            e.running.append(sh.prompt)
            e.admitted += 1
            used += sh.blocks_for(sh.prompt)
        if used >= sh.blocks:
            return e.t
        next_send = e.sends[e.sent] if e.sent < len(e.sends) else until
        calm_s = min(next_send, e.segment_end, until) - e.t  # no send, no change of speed
        bt = sh.block_tokens
        steps = max(
            1,
            min(
                [bt - n % bt + 1 if n % bt else 1 for n in e.running]
                + [done - n for n in e.running]
                + [math.ceil(calm_s / e.step_s)]
            ),
        )
        while next_scrape < e.t + steps * e.step_s:
            assert scrape is not None
            scrape(next_scrape, e)
            next_scrape += SCRAPE_S
        e.t += steps * e.step_s
        e.generated += steps * len(e.running)
        e.running = [n + steps for n in e.running if n + steps < done]
        if sum(sh.blocks_for(n) for n in e.running) > sh.blocks:
            return e.t  # a step found no block free: vLLM preempts here
    return until
