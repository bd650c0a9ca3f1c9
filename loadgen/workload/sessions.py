"""Conversations: what each turn of a session sends, as users' chat apps and agents send it.

A session opens with its own first prompt (`--input-len` tokens, after a system prompt all
sessions share when `--shared-prefix` is given) and runs `--turns` turns. Every turn resends the
whole conversation so far, in exact tokens (the earlier prompts, the server's own answers as
token ids, and the earlier user messages), plus a new user message of `--turn-input-len`
tokens; `--think-time` seconds pass between an answer and the next turn. With `--fanout N` a
turn is an agent's step: N calls in parallel over the same context, each with its own tool
message, joined into the context in order before the next turn.

So a server whose prefix cache holds a session's context serves a late turn from the cache and
its TTFT stays flat; one whose cache evicted it recomputes the whole context, and TTFT grows
with the turn. This module holds the pure part (shapes and prompts); the runner sends them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvwatch.loadgen.workload.lengths import DatasetError, LengthDist, parse_length
from kvwatch.loadgen.workload.priorities import Classes, draw_priority
from kvwatch.loadgen.workload.token_blocks import TokenBlocks

__all__ = ["SessionShape", "Conversation", "Conversations", "parse_think_time"]

_SYSTEM_BLOCK = 2**41 + 2**40  # the shared system prompt's block number
_SESSION_BASE = 2**40  # session k opens with block _SESSION_BASE + k


def parse_think_time(spec: str) -> LengthDist | None:
    """Seconds between an answer and the next turn: 0 (none) or a length-style distribution."""
    if spec.strip() in ("0", "0.0", "fixed:0"):
        return None
    try:
        return parse_length(spec)
    except DatasetError as e:
        raise DatasetError(str(e).replace("length", "think time", 1)) from None


@dataclass(frozen=True)
class SessionShape:
    """What every session of a run looks like (the flags, parsed); picklable for workers."""

    turns: str = "4"
    think_time: str = "0"
    first_input_len: str = "128"
    turn_input_len: str = "64"
    output_len: str = "128"
    fanout: int = 1
    system_prompt: int = 0  # tokens of a system prompt every session starts with

    def check(self) -> None:
        """Parse every distribution once, so a bad flag fails before the run."""
        for spec in (self.turns, self.first_input_len, self.turn_input_len, self.output_len):
            parse_length(spec)
        parse_think_time(self.think_time)
        if self.fanout < 1:
            raise DatasetError(f"--fanout {self.fanout}: at least 1 call a turn")
        if self.system_prompt < 0:
            raise DatasetError("--shared-prefix: a number of tokens, 0 or more")

    def describe(self) -> dict[str, Any]:
        return {
            "sessions": True, "turns": self.turns, "think_time_s": self.think_time,
            "input_len": self.first_input_len, "turn_input_len": self.turn_input_len,
            "output_len": self.output_len, "fanout": self.fanout,
            "shared_prefix": self.system_prompt, "token_exact": True,
        }  # fmt: skip


class Conversation:
    """One session's context and draws. `number` makes its opening unique; the seed and the
    number fix every length and think time, the same in any worker process."""

    def __init__(self, shape: SessionShape, blocks: TokenBlocks, number: int, seed: int) -> None:
        self.shape, self.blocks, self.number = shape, blocks, number
        self.rng = random.Random(f"{seed}:{number}")
        self.turns = parse_length(shape.turns).sample(self.rng)
        self._think = parse_think_time(shape.think_time)
        self._first = parse_length(shape.first_input_len)
        self._turn = parse_length(shape.turn_input_len)
        self._out = parse_length(shape.output_len)
        self.priority: int | None = None
        self.context: list[int] = []
        if shape.system_prompt:
            self.context = blocks.block(_SYSTEM_BLOCK, shape.system_prompt)

    def think_s(self) -> float:
        return 0.0 if self._think is None else self._think.draw(self.rng)

    def calls(self, turn: int) -> list[tuple[tuple[int, ...], int]]:
        """This turn's calls: (prompt token ids, max tokens) each. The first turn is one call
        that opens the session with its own numbered block; a later one adds a user message
        (or, fanned out, one tool message per call)."""
        out = []
        for _ in range(1 if turn == 0 else self.shape.fanout):
            if turn == 0:
                msg = self.blocks.block(_SESSION_BASE + self.number, self._first.sample(self.rng))
            else:
                msg = self.blocks.text(self.rng, self._turn.sample(self.rng))
            out.append((tuple(self.context + msg), self._out.sample(self.rng)))
        return out

    def join(self, calls: list[tuple[tuple[int, ...], int]], answers: list[list[int]]) -> None:
        """The context after a turn: each call's message and answer, in order."""
        base = len(self.context)
        for (prompt, _), answer in zip(calls, answers, strict=True):
            self.context.extend(prompt[base:])
            self.context.extend(answer)


class Conversations:
    """Opens the run's sessions by number, in any process: the shape, the corpus, the seed,
    and the priority classes (a session keeps its class for every turn)."""

    def __init__(self, shape: SessionShape, tokens: tuple[int, ...], seed: int,
                 classes: Classes | None = None) -> None:  # fmt: skip
        self.shape, self.seed, self.classes = shape, seed, classes
        self.blocks = TokenBlocks(tokens, seed)

    def open(self, number: int) -> Conversation:
        talk = Conversation(self.shape, self.blocks, number, self.seed)
        if self.classes is not None:
            talk.priority = draw_priority(random.Random(f"{self.seed}:{number}:priority"),
                                          self.classes)  # fmt: skip
        return talk
