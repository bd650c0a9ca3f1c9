"""Timestamped traces as people publish them, read as outside input, and what to replay of them.

Formats (told from the file, or named with --trace-format):

| format | file | fields |
|---|---|---|
| mooncake | JSONL | `timestamp` (ms), `input_length`, `output_length`, `hash_ids` |
| azure | CSV | `TIMESTAMP` (date and time), `ContextTokens`, `GeneratedTokens` |
| kvwatch | JSONL | `t` (s), `input_tokens`, `output_tokens`; optional `hash_ids`, `priority` |

`hash_ids` number the trace's blocks of `block_tokens` prompt tokens (Mooncake's are 512): two
requests whose prompts start with the same ids start with the same tokens, so the replay builds
prompts that share exactly those prefixes and the server's prefix cache sees the trace's sharing.
A row that cannot be used is skipped and counted by reason; a file with none left, or one whose
format cannot be told, is an error that names the file and line.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "FORMATS", "TraceError", "TraceRequest", "Trace", "ReplayPlan", "TraceReplay", "read_trace",
    "plan_replay", "replay_offsets", "implied_hit_rate", "replay_report",
]  # fmt: skip

FORMATS = ("mooncake", "azure", "kvwatch")
MOONCAKE_BLOCK_TOKENS = 512
MIN_BLOCK_TOKENS = 8  # a scaled block still carries its id (trace_prompts.py) and some text
_MAX_HASH_ID = 2**40
# no model has a context near 2^31 tokens; larger counts only overflow the scaling after
MAX_TOKENS = 2**31 - 1
# vLLM's priority is a 64-bit integer: one outside got every request a 400 (and lost the run)
PRIORITY_RANGE = (-(2**63), 2**63 - 1)
_EXAMPLES = 3  # skipped rows quoted per reason


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file (and line) and why."""


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # trace time, seconds from the trace's own zero
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    priority: int | None = None
    row: int = 0  # line (JSONL) or row (CSV, header = 1) it came from


@dataclass(frozen=True)
class Trace:
    path: Path
    format: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows
    examples: dict[str, list[int]] = field(default_factory=dict)  # reason -> first rows
    # rows whose time falls outside the window asked for: left unread past their time
    outside_window: int = 0


def _skip(skipped: Counter[str], examples: dict[str, list[int]], reason: str, row: int) -> None:
    skipped[reason] += 1
    rows = examples.setdefault(reason, [])
    if len(rows) < _EXAMPLES:
        rows.append(row)


def _count(value: Any, *, minimum: int) -> int | None:
    """A whole number of tokens at least `minimum` (JSON ints, or CSV text), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, int) and minimum <= value <= MAX_TOKENS
    return value if ok else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:  # an int past any float: 10^400 ms is no time
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _hash_ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < _MAX_HASH_ID for h in value
    ):
        return None
    return tuple(value)


def _json_row(fmt: str, rec: Any) -> TraceRequest | str:
    """One JSONL record as a request, or why it is skipped."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if fmt == "mooncake":
        ms = _seconds(rec.get("timestamp"))
        at = None if ms is None else ms / 1000.0
        n_in, n_out = rec.get("input_length"), rec.get("output_length")
    else:
        at = _seconds(rec.get("t"))
        n_in, n_out = rec.get("input_tokens"), rec.get("output_tokens")
    if at is None:
        return "bad timestamp"
    inp, out = _count(n_in, minimum=1), _count(n_out, minimum=1)
    if inp is None:
        return "bad input length"
    if out is None:
        return "bad output length (a request must ask for at least 1 token)"
    ids = _hash_ids(rec.get("hash_ids"))
    if ids is None:
        return "bad hash_ids (a list of ids from 0)"
    prio = rec.get("priority")
    if prio is not None and (
        isinstance(prio, bool)
        or not isinstance(prio, int)
        or not PRIORITY_RANGE[0] <= prio <= PRIORITY_RANGE[1]
    ):
        return "bad priority (a whole number that fits 64 bits)"
    return TraceRequest(at, inp, out, ids, prio)


def _sniff(path: Path, head: str) -> str:
    first = head.lstrip().splitlines()[0] if head.strip() else ""
    if first.startswith("{"):
        try:
            rec = json.loads(first)
        except ValueError:
            rec = {}
        if isinstance(rec, dict) and "input_tokens" in rec:
            return "kvwatch"
        if isinstance(rec, dict) and ("input_length" in rec or "hash_ids" in rec):
            return "mooncake"
    elif "ContextTokens" in first and "TIMESTAMP" in first:
        return "azure"
    raise TraceError(
        f"{path}: cannot tell the trace format from its first line; name it with "
        f"--trace-format ({', '.join(FORMATS)})"
    )


def _lines(path: Path) -> Iterator[str]:
    """The file's lines as they are read (a 100 MB trace is never held whole), a UTF-8 BOM
    dropped; TraceError where it cannot be read or is not UTF-8."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            for line in f:
                yield line.rstrip("\r\n")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None


# where a JSONL row's time is, read without parsing the row: a row outside the window is
# counted and not parsed (a short window of a 100 MB trace parses only its own rows). Used
# only where the key appears once in the line; anything else is parsed in full
_TIME_KEY = {"mooncake": ('"timestamp"', 1e-3), "kvwatch": ('"t"', 1.0)}
_NUMBER = re.compile(r"\s*:\s*(-?[0-9][0-9.eE+-]{0,30})\s*[,}]")


def _quick_time(fmt: str, line: str) -> float | None:
    key, scale = _TIME_KEY[fmt]
    at = line.find(key)
    if at < 0 or line.find(key, at + 1) >= 0:
        return None
    m = _NUMBER.match(line, at + len(key))
    if m is None:
        return None
    try:
        v = float(m.group(1)) * scale
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _azure_rows(path: Path, lines: Iterator[str], skipped: Counter[str],
                ex: dict[str, list[int]]) -> Iterator[TraceRequest]:  # fmt: skip
    reader = csv.reader(lines)
    header = next(reader, None) or []
    cols = {name.strip(): i for i, name in enumerate(header)}
    missing = [c for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if c not in cols]
    if missing:
        raise TraceError(f"{path}:1: an Azure trace needs the columns {', '.join(missing)}")
    zero: datetime | None = None
    for row_no, row in enumerate(reader, 2):
        if not any(c.strip() for c in row):
            continue
        if len(row) < len(header):
            _skip(skipped, ex, "missing columns", row_no)
            continue
        try:
            when = datetime.fromisoformat(row[cols["TIMESTAMP"]].strip())
        except ValueError:
            _skip(skipped, ex, "bad timestamp", row_no)
            continue
        zero = zero or when
        if (when.tzinfo is None) != (zero.tzinfo is None):
            # naive and zoned cannot be subtracted; which zone a naive one meant is a guess
            _skip(skipped, ex, "timestamp with a time zone unlike the first row's", row_no)
            continue
        at = (when - zero).total_seconds()
        inp = _count(row[cols["ContextTokens"]], minimum=1)
        out = _count(row[cols["GeneratedTokens"]], minimum=1)
        if inp is None:
            _skip(skipped, ex, "bad input length", row_no)
        elif out is None:
            _skip(skipped, ex, "bad output length (a request must ask for at least 1 token)",
                  row_no)  # fmt: skip
        else:
            yield TraceRequest(at, inp, out, row=row_no)


def read_trace(
    path: Path,
    fmt: str | None = None,
    block_tokens: int | None = None,
    window_s: tuple[float, float] | None = None,
) -> Trace:
    """Every usable request of the file, sorted by time (stable); the rest counted by reason.
    With `window_s` (START, END seconds of trace time), only the rows in it are kept, and a
    JSONL row whose time says it is outside is counted without being parsed."""
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"trace format {fmt!r}: one of {', '.join(FORMATS)}")
    lines = _lines(path)
    numbered = ((n, line) for n, line in enumerate(lines, 1) if line.strip())
    first = next(numbered, None)
    # the whole first line, however long: a 4 KB cut left a long first record unrecognised
    fmt = fmt or _sniff(path, first[1] if first else "")
    skipped: Counter[str] = Counter()
    examples: dict[str, list[int]] = {}
    requests: list[TraceRequest] = []
    lo, hi = window_s if window_s is not None else (-math.inf, math.inf)
    outside = 0
    if fmt == "azure":
        head = [] if first is None else [first[1]]
        for r in _azure_rows(path, itertools.chain(head, lines), skipped, examples):
            if lo <= r.at_s < hi:
                requests.append(r)
            else:
                outside += 1
    else:
        for line_no, line in itertools.chain([first] if first else [], numbered):
            if window_s is not None:
                quick = _quick_time(fmt, line)
                if quick is not None and not lo <= quick < hi:
                    outside += 1
                    continue
            try:
                got = _json_row(fmt, json.loads(line))
            except ValueError:
                got = "not valid JSON"
            except RecursionError:
                got = "JSON nested too deep"
            if isinstance(got, str):
                _skip(skipped, examples, got, line_no)
            elif lo <= got.at_s < hi:
                requests.append(replace(got, row=line_no))
            else:
                outside += 1
    if not requests:
        said = "; ".join(f"{n} {why} (e.g. line {examples[why][0]})" for why, n in skipped.items())
        if outside:
            said = f"{outside} outside the window" + (f"; {said}" if said else "")
        raise TraceError(f"{path}: no usable {fmt} rows" + (f": {said}" if said else ""))
    bt = MOONCAKE_BLOCK_TOKENS if block_tokens is None else block_tokens
    if bt < MIN_BLOCK_TOKENS:
        raise TraceError(f"block tokens {bt}: at least {MIN_BLOCK_TOKENS}")
    requests.sort(key=lambda r: r.at_s)
    return Trace(path, fmt, tuple(requests), bt, dict(skipped), examples, outside)


@dataclass(frozen=True)
class ReplayPlan:
    """What is replayed: the requests in the window (up to the cap), times from the window's
    first request, divided by `speed` (or, with `speed_end`, by a speed that moves evenly from
    `speed` to `speed_end` in replay time: a ramp with the trace's own shape); lengths (and the
    block size) times `length_scale`, and a request still longer than `max_model_len` clipped
    to it (prompt first kept whole)."""

    requests: tuple[TraceRequest, ...]
    offsets_s: tuple[float, ...]  # send times, seconds from the replay's start
    block_tokens: int
    speed: float
    length_scale: float
    window_s: tuple[float, float] | None
    clipped: int  # requests shortened to fit max_model_len
    left_out: int  # requests outside the window (read or only counted) or over the cap
    speed_end: float | None = None  # the speed at the replay's end (None: `speed` throughout)


def replay_offsets(times: list[float], speed: float, speed_end: float | None) -> list[float]:
    """Seconds from the replay's start for trace seconds `times` (from the first request): at
    `speed` throughout, or at a speed that moves evenly in replay time from `speed` to
    `speed_end` over the whole replay. The replay lasts D = 2 T / (speed + speed_end) for a
    trace span T, and a trace time x is reached at the t where speed t + (speed_end -
    speed) t^2 / 2D = x (the stable root: 2x / (speed + sqrt(speed^2 + 4ax)))."""
    if speed_end is None or speed_end == speed or not times or times[-1] <= 0:
        return [x / speed for x in times]
    span = times[-1]
    a = (speed_end - speed) * (speed + speed_end) / (4.0 * span)  # (s1 - s0) / 2D
    # speed^2 + 4 a x stays at least min(speed, speed_end)^2 for x within the span
    return [2.0 * x / (speed + math.sqrt(max(speed * speed + 4.0 * a * x, 0.0))) for x in times]


def _scaled(n: int, k: float) -> int:
    return max(1, round(n * k))


def plan_replay(
    trace: Trace,
    speed: float = 1.0,
    window_s: tuple[float, float] | None = None,
    max_requests: int | None = None,
    max_duration_s: float | None = None,
    length_scale: float = 1.0,
    max_model_len: int | None = None,
    speed_end: float | None = None,
) -> ReplayPlan:
    if not (speed > 0 and math.isfinite(speed)):
        raise TraceError(f"trace speed {speed!r}: a positive number (2 = twice as fast)")
    if speed_end is not None and not (speed_end > 0 and math.isfinite(speed_end)):
        raise TraceError(f"trace end speed {speed_end!r}: a positive number")
    if not (length_scale > 0 and math.isfinite(length_scale)):
        raise TraceError(f"length scale {length_scale!r}: a positive number")
    picked = list(trace.requests)
    if window_s is not None:
        lo, hi = window_s
        if not 0 <= lo < hi:
            raise TraceError(f"trace window {lo:g}:{hi:g}: START < END, both seconds from 0")
        picked = [r for r in picked if lo <= r.at_s < hi]
        if not picked:
            raise TraceError(f"{trace.path}: no request between {lo:g} s and {hi:g} s")
    zero = picked[0].at_s
    offsets = replay_offsets([r.at_s - zero for r in picked], speed, speed_end)
    if not all(math.isfinite(o) for o in offsets):
        raise TraceError(f"trace speed {speed:g}: the trace's send times stretch past any clock")
    if max_duration_s is not None:
        keep = sum(1 for o in offsets if o < max_duration_s)
        picked, offsets = picked[:keep], offsets[:keep]
    if max_requests is not None:
        picked, offsets = picked[:max_requests], offsets[:max_requests]
    block = _scaled(trace.block_tokens, length_scale)
    if block < MIN_BLOCK_TOKENS:
        raise TraceError(
            f"length scale {length_scale:g} makes the trace's {trace.block_tokens}-token blocks "
            f"{block} tokens: at least {MIN_BLOCK_TOKENS}"
        )
    out: list[TraceRequest] = []
    clipped = 0
    for r in picked:
        inp, gen = _scaled(r.input_tokens, length_scale), _scaled(r.output_tokens, length_scale)
        if max_model_len is not None and inp + gen > max_model_len:
            clipped += 1
            gen = min(gen, max(1, max_model_len - inp))
            inp = max(1, max_model_len - gen)
        out.append(replace(r, input_tokens=inp, output_tokens=gen))
    return ReplayPlan(
        tuple(out), tuple(offsets), block, speed, length_scale, window_s, clipped,
        len(trace.requests) + trace.outside_window - len(out), speed_end,
    )  # fmt: skip


def implied_hit_rate(plan: ReplayPlan, server_block: int = 16) -> float:
    """The share of prompt tokens a prefix cache that holds everything would serve, as vLLM
    counts hits: whole server blocks of a prompt that an earlier prompt started the same way,
    never the prompt's last token (vLLM computes it to sample from)."""
    seen: dict[tuple[int, ...], int] = {}  # a block chain -> most tokens of its last block sent
    hits = total = 0
    for r in plan.requests:
        shared = 0
        chain: tuple[int, ...] = ()
        matching = True
        for k, h in enumerate(r.hash_ids):
            start = k * plan.block_tokens
            if start >= r.input_tokens:
                break
            here = min(plan.block_tokens, r.input_tokens - start)
            chain = (*chain, h)
            before = seen.get(chain, 0)
            if matching:
                shared += min(here, before)
                matching = before >= here
            seen[chain] = max(before, here)
        usable = min(shared, r.input_tokens - 1)
        hits += usable // server_block * server_block
        total += r.input_tokens
    return hits / total if total else 0.0


@dataclass(frozen=True)
class TraceReplay:
    """A replay as the command line asks for it: enough to rebuild the same plan in a worker
    process (the file is read again there)."""

    path: Path
    format: str | None = None
    block_tokens: int | None = None
    speed: float = 1.0
    window_s: tuple[float, float] | None = None
    max_requests: int | None = None
    max_duration_s: float | None = None
    length_scale: float = 1.0
    max_model_len: int | None = None
    time_scale: float = 1.0  # a kvwatch twin's: the trace's times stretch with its card's
    speed_end: float | None = None  # the speed rises (or falls) evenly to this one

    def plan(self) -> tuple[Trace, ReplayPlan]:
        """Read and planned once per process: the command checks it, builds the stage, the
        prompts and the report from the same replay (a whole trace takes a quarter second)."""
        return _planned(self)

    def _plan(self) -> tuple[Trace, ReplayPlan]:
        try:
            st = self.path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = (0, 0)  # read_trace says why
        trace = _read_once(self.path, self.format, self.block_tokens, self.window_s, key)
        return trace, plan_replay(
            trace, self.speed / self.time_scale, self.window_s, self.max_requests,
            self.max_duration_s, self.length_scale, self.max_model_len,
            None if self.speed_end is None else self.speed_end / self.time_scale,
        )  # fmt: skip


def replay_report(
    replay: TraceReplay, server: dict[str, Any] | None, cache: dict[str, Any] | None
) -> dict[str, Any]:
    """What was replayed of the trace, and the prefix-cache hit rate its `hash_ids` imply for
    a cache that holds everything beside the one vLLM's counters measured (`server`: the
    run's counter increases; `cache`: the server's cache config, for its block size)."""
    trace, plan = replay.plan()
    block = (cache or {}).get("block_size")
    server_block = block if isinstance(block, int) and block > 0 else 16
    cached = (server or {}).get("prompt_tokens_cached")
    computed = (server or {}).get("prompt_tokens_computed")
    measured = None
    if cached is not None and computed is not None and cached + computed > 0:
        measured = cached / (cached + computed)
    return {
        "path": str(trace.path),
        "format": trace.format,
        "usable_rows": len(trace.requests),
        "rows_outside_window": trace.outside_window,
        "skipped_rows": trace.skipped,
        "replayed": len(plan.requests),
        "left_out": plan.left_out,
        "clipped": plan.clipped,
        "speed": replay.speed,
        "speed_end": replay.speed_end,
        "time_scale": replay.time_scale,
        "window_s": list(plan.window_s) if plan.window_s else None,
        "length_scale": plan.length_scale,
        "block_tokens": plan.block_tokens,
        "span_s": plan.offsets_s[-1],
        "input_tokens": sum(r.input_tokens for r in plan.requests),
        "output_tokens": sum(r.output_tokens for r in plan.requests),
        "shares_prefixes": any(r.hash_ids for r in plan.requests),
        "server_block_size": server_block,
        "implied_prefix_hit_rate": implied_hit_rate(plan, server_block),
        "measured_prefix_hit_rate": measured,
    }


@functools.lru_cache(maxsize=4)
def _planned(replay: TraceReplay) -> tuple[Trace, ReplayPlan]:
    return replay._plan()


@functools.lru_cache(maxsize=1)
def _read_once(
    path: Path,
    fmt: str | None,
    block_tokens: int | None,
    window_s: tuple[float, float] | None,
    changed: tuple[int, int],
) -> Trace:
    """One read of a file per process, while it is unchanged (`changed`: its mtime and size):
    a run plans its replay twice (checked before the server is asked, then fitted to its
    context length), and a 100 MB trace was parsed, and held, twice."""
    return read_trace(path, fmt, block_tokens, window_s)
