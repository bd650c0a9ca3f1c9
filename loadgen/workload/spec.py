"""What each request asks for: synthetic prompts of chosen token lengths, or a dataset.

Synthetic prompts are measured in tokens of the served model: when the server has `/tokenize`, a
seeded corpus is tokenized once and prompts are slices of its token ids, sent as token-id prompts
(exact lengths on /v1/completions); chat gets text of the same length at the tokens-per-word ratio
measured on the corpus, plus the chat template's few tokens. Without `/tokenize`, text is built
from words at an assumed 1.3 tokens per word.

Length distributions (`--input-len`, `--output-len`):
    300 | fixed:300 | uniform:100,300 | normal:200,50 | lognormal:200,0.5 (median, sigma)
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from kvwatch.loadgen.workload.lengths import DatasetError, LengthDist, parse_length
from kvwatch.loadgen.workload.priorities import Classes, draw_priority
from kvwatch.loadgen.workload.probes import PROBE_SEED_OFFSET, ProbeSpec
from kvwatch.loadgen.workload.sessions import Conversations, SessionShape
from kvwatch.loadgen.workload.trace import TraceReplay
from kvwatch.loadgen.workload.trace_prompts import trace_prompts

__all__ = [
    "LengthDist",
    "WorkItem",
    "DatasetError",
    "parse_length",
    "tokenize_corpus",
    "synthetic_items",
    "load_dataset",
    "WorkloadSpec",
]

_WORDS_PER_TOKEN = 1 / 1.3
_CORPUS_WORDS = 6000


@dataclass(frozen=True)
class WorkItem:
    """One request's content. `token_ids` is set when lengths were measured with /tokenize."""

    text: str
    max_tokens: int
    input_tokens: int | None = None  # the length we aimed for, when known
    token_ids: tuple[int, ...] | None = None
    priority: int | None = None  # vLLM's `priority` (lower runs first under its priority policy)
    answer_ids: bool = False  # ask for the answer's token ids (a session resends them)

    def body(self, model: str, chat: bool, ignore_eos: bool) -> dict[str, Any]:
        base: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens}
        if ignore_eos:
            base["ignore_eos"] = True
        if self.priority is not None:
            base["priority"] = self.priority
        if self.answer_ids:
            base["return_token_ids"] = True
        if chat:
            base["messages"] = [{"role": "user", "content": self.text}]
        else:
            base["prompt"] = list(self.token_ids) if self.token_ids else self.text
        return base


def _corpus(seed: int, words: int = _CORPUS_WORDS) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("etaoinshrdlucmfwyp", k=rng.randint(2, 8))) for _ in range(800)]
    return [rng.choice(vocab) for _ in range(words)]


async def tokenize_corpus(
    client: httpx.AsyncClient, base_url: str, model: str, seed: int
) -> tuple[list[int], str] | None:
    """Token ids of the seeded corpus (and its text), or None if the server has no /tokenize."""
    text = " ".join(_corpus(seed))
    try:
        r = await client.post(
            base_url.rstrip("/") + "/tokenize",
            json={"model": model, "prompt": text, "add_special_tokens": False},
        )
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        tokens = r.json().get("tokens")
    except (ValueError, AttributeError):
        return None  # not vLLM's /tokenize: fall back to words
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        return None
    return list(tokens), text


def synthetic_items(
    input_len: LengthDist,
    output_len: LengthDist,
    seed: int,
    tokens: list[int] | None = None,
    shared_prefix: int = 0,
    prefix_groups: int = 1,
) -> Iterator[WorkItem]:
    """Endless seeded prompts; with `shared_prefix`, each starts with one of `prefix_groups`
    common prefixes (so prefix caching can share their blocks)."""
    rng = random.Random(seed)
    words = _corpus(seed)
    # Text for chat: as many corpus words as give the wanted tokens in this model's tokenizer.
    wpt = len(words) / len(tokens) if tokens else _WORDS_PER_TOKEN
    prefixes = [_slice(rng, tokens, words, shared_prefix, wpt) for _ in range(prefix_groups)]
    i = 0
    while True:
        want = input_len.sample(rng)
        ids, text = _slice(rng, tokens, words, want, wpt)
        if shared_prefix:
            pids, ptext = prefixes[i % prefix_groups]
            ids = pids + ids if ids is not None and pids is not None else None
            text = ptext + " " + text
            want += shared_prefix
        yield WorkItem(text, output_len.sample(rng), want, tuple(ids) if ids is not None else None)
        i += 1


def _slice(
    rng: random.Random, tokens: list[int] | None, words: list[str], n: int, words_per_token: float
) -> tuple[list[int] | None, str]:
    if n <= 0:
        return ([] if tokens is not None else None), ""
    nwords = max(1, round(n * words_per_token))
    text = " ".join(_cycle_slice(words, rng.randrange(len(words)), nwords))
    if tokens is None:
        return None, text
    start = rng.randrange(len(tokens))
    return _cycle_slice(tokens, start, n), text


def _cycle_slice(items: list[Any], start: int, n: int) -> list[Any]:
    return [items[(start + k) % len(items)] for k in range(n)]


def _json_records(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not UTF-8 text") from None
    stripped = raw.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise DatasetError(f"{path}: not valid JSON ({e})") from None
        yield from enumerate(data, 1)
        return
    for lineno, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except ValueError as e:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({e})") from None


def _sharegpt_item(rec: Any) -> tuple[str, str | None] | None:
    conv = rec.get("conversations") if isinstance(rec, dict) else None
    if not isinstance(conv, list):
        return None
    human = next(
        (t for t in conv if isinstance(t, dict) and t.get("from") in ("human", "user")), None
    )
    if human is None or not isinstance(human.get("value"), str):
        return None
    idx = conv.index(human)
    reply = conv[idx + 1] if idx + 1 < len(conv) and isinstance(conv[idx + 1], dict) else None
    return human["value"], (reply or {}).get("value")


def load_dataset(
    path: Path, output_len: LengthDist | None, limit: int | None = None
) -> list[WorkItem]:
    """ShareGPT JSON/JSONL (`conversations`) or custom JSONL (`prompt`, optional `max_tokens`).

    Without `output_len`, a ShareGPT item asks for about as many tokens as its recorded reply.
    Records that are not usable are skipped; a file with none left is an error.
    """
    items: list[WorkItem] = []
    skipped = 0
    for where, rec in _json_records(path):
        if isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
            mt = rec.get("max_tokens")
            if mt is not None and (not isinstance(mt, int) or mt < 1):
                raise DatasetError(f"{path}:{where}: max_tokens must be a positive integer")
            if mt is None and output_len is None:
                raise DatasetError(f"{path}:{where}: no max_tokens; give --output-len")
            n_out = mt if mt is not None else output_len.sample(random.Random(where))  # type: ignore[union-attr]
            items.append(WorkItem(rec["prompt"], n_out))
        elif (pair := _sharegpt_item(rec)) is not None:
            prompt, reply = pair
            if output_len is not None:
                n_out = output_len.sample(random.Random(where))
            elif reply:
                n_out = max(1, round(len(reply.split()) / _WORDS_PER_TOKEN))
            else:
                skipped += 1
                continue
            items.append(WorkItem(prompt, n_out))
        else:
            skipped += 1
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise DatasetError(
            f"{path}: no usable records ({skipped} skipped); expected ShareGPT "
            '{"conversations": [{"from": "human", "value": ...}, ...]} or {"prompt": ...}'
        )
    return items


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything needed to rebuild the same item sequence, in this or a worker process."""

    input_len: str = "128"
    output_len: str | None = None
    seed: int = 0
    dataset: Path | None = None
    shared_prefix: int = 0
    prefix_groups: int = 1
    tokens: tuple[int, ...] | None = None  # the seeded corpus, tokenized by the server
    trace: TraceReplay | None = None  # replay a trace's requests instead (--trace)
    sessions: SessionShape | None = None  # conversations instead of single requests
    priorities: Classes | None = None  # priority classes and their shares (--priorities)
    probes: ProbeSpec | None = None  # a bystander stream beside the load (--probe-rate)

    def conversations(self) -> Conversations | None:
        """The run's sessions, where it runs sessions (their prompts need the corpus)."""
        if self.sessions is None:
            return None
        if not self.tokens:
            raise DatasetError(
                "sessions resend the conversation in exact tokens: the server must answer /tokenize"
            )
        try:
            return Conversations(self.sessions, self.tokens, self.seed, self.priorities)
        except ValueError as e:
            raise DatasetError(str(e)) from None

    def items(self) -> Iterator[WorkItem]:
        items = self._items()
        if self.priorities is None:
            return items
        return _with_priorities(items, self.priorities, self.seed)

    def probe_stream(self) -> tuple[ProbeSpec, Iterator[WorkItem]] | None:
        """The probes and their prompts (None without probes): fixed lengths from a seed of
        their own, each slice of the corpus reversed, so that no probe begins as a prompt of
        the load does and none is served from the load's cached prefixes."""
        if self.probes is None:
            return None
        p = self.probes
        items = synthetic_items(
            parse_length(str(p.input_tokens)), parse_length(str(p.output_tokens)),
            self.seed + PROBE_SEED_OFFSET, tokens=list(self.tokens) if self.tokens else None,
        )  # fmt: skip
        return p, (_reversed(item) for item in items)

    def _items(self) -> Iterator[WorkItem]:
        if self.trace is not None:
            if not self.tokens:
                raise DatasetError(
                    "a trace replay sends token-exact prompts: the server must answer /tokenize"
                )
            plan = self.trace.plan()[1]
            prompts = trace_prompts(plan, self.tokens, self.seed)
            for r, ids in zip(plan.requests, prompts, strict=True):
                yield WorkItem("", r.output_tokens, r.input_tokens, ids, r.priority)
            return
        out_len = parse_length(self.output_len) if self.output_len else None
        if self.dataset is not None:
            records = load_dataset(self.dataset, out_len)
            rng = random.Random(self.seed)
            while True:
                order = records[:]
                rng.shuffle(order)
                yield from order
        yield from synthetic_items(
            parse_length(self.input_len),
            out_len or parse_length("128"),
            self.seed,
            tokens=list(self.tokens) if self.tokens else None,
            shared_prefix=self.shared_prefix,
            prefix_groups=max(1, self.prefix_groups),
        )

    def describe(self) -> dict[str, Any]:
        out = self._describe()
        if self.priorities is not None:
            out["priorities"] = {str(p): share for p, share in self.priorities}
        if self.probes is not None:
            out["probes"] = self.probes.describe()
        return out

    def _describe(self) -> dict[str, Any]:
        if self.sessions is not None:
            return self.sessions.describe()
        if self.trace is not None:
            tr = self.trace
            return {"trace": str(tr.path), "format": tr.format, "speed": tr.speed,
                    "window_s": tr.window_s, "length_scale": tr.length_scale,
                    "block_tokens": tr.block_tokens, "max_model_len": tr.max_model_len,
                    "token_exact": True}  # fmt: skip
        if self.dataset is not None:
            return {"dataset": str(self.dataset), "output_len": self.output_len}
        return {
            "synthetic": True,
            "input_len": self.input_len,
            "output_len": self.output_len or "128",
            "token_exact": self.tokens is not None,
            "shared_prefix": self.shared_prefix,
            "prefix_groups": self.prefix_groups,
        }


def _reversed(item: WorkItem) -> WorkItem:
    ids = item.token_ids[::-1] if item.token_ids is not None else None
    return replace(item, text=" ".join(reversed(item.text.split())), token_ids=ids)


def _with_priorities(items: Iterator[WorkItem], classes: Classes, seed: int) -> Iterator[WorkItem]:
    """Each item with a class drawn from its own stream of the seed (one the item already
    carries, from a trace, is kept)."""
    rng = random.Random(f"{seed}:priority")
    for item in items:
        prio = draw_priority(rng, classes)
        yield item if item.priority is not None else replace(item, priority=prio)
