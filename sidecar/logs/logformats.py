"""vLLM log lines kvwatch understands, across versions (docs/log-formats.md has examples).

- V0 preemption warning (0.4.3-0.10.2), printed on the 1st, 51st, 101st... preemption only;
- V1 periodic stats line (all wordings: GPU/CPU/other device, optional Deferred and Preemptions
  fields, `N Engines Aggregated`, with or without the `Engine 000:` prefix);
- V0 periodic stats line (Swapped/Pending, GPU and CPU KV usage);
- startup capacity: `<dev> KV cache size: N tokens` and `Maximum concurrency for L tokens per
  request: Cx` (one line or two, by era), and V0's `# GPU blocks: N, # CPU blocks: M`;
- the server's version (the startup banner's `version X`, older `vLLM API server version X`)
  and its `non-default args: {...}` (0.9+), so advice names only the flags that version has;
- incident lines (sidecar/logs/incidents.py): the engine dying or failing to start, out of memory,
  KV loads failing, failed health checks, and the last line of a traceback.

Most lines of a busy log are access-log lines. `parse_text` finds candidate lines with plain
substring search over a whole chunk and runs a regex only on those, so unknown lines cost almost
nothing (bench/bench_logs.py).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from kvwatch.sidecar.logs.incidents import INCIDENT_NEEDLES, IncidentLine, incident_line

__all__ = [
    "PreemptionWarning", "StatsLine", "IterationLine", "Capacity", "ServerStart", "Malformed",
    "IncidentLine", "LogEvent",
    "parse_line", "parse_text", "event_to_dict",
]  # fmt: skip

_TIME = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR|WARN)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
_NUM = r"(\d[\d,]*)"

_PREEMPT = re.compile(
    r"Sequence group (?P<id>\S+) is preempted by (?:PreemptionMode\.)?(?P<mode>\w+) mode because "
    r"there is not enough KV cache space\..*?total_num_cumulative_preemption=(?P<n>\d+)"
)
_V1_STATS = re.compile(
    r"(?:(?:Engine (?P<engine>\d+)|(?P<agg>\d+) Engines Aggregated): )?"
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, "
    r"Avg generation throughput: (?P<gen>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
    r"(?:, Deferred: (?P<deferred>\d+) reqs)?"
    r"(?:, KV fetch: (?P<fetch_wait>\d+) waiting to start, (?P<fetch_run>\d+) in progress, "
    r"(?P<fetch_done>\d+) completed waiting)?"
    r"(?:, Preemptions: (?P<preempt>\d+))?"
    r", (?P<device>\w+) KV cache usage: (?P<kv>[\d.]+)%"
    r"(?:, Prefix cache hit rate: (?P<hit>[\d.]+)%)?"
)
_V0_STATS = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, "
    r"Avg generation throughput: (?P<gen>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, Swapped: (?P<swapped>\d+) reqs, "
    r"Pending: (?P<waiting>\d+) reqs, GPU KV cache usage: (?P<kv>[\d.]+)%, "
    r"CPU KV cache usage: (?P<cpukv>[\d.]+)%"
)
# 0.33 `--enable-logging-iteration-details`: one line per engine step
_ITERATION = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<index>\d+)\): "
    r"(?P<ctx_reqs>\d+) context requests, (?P<ctx_tokens>\d+) context tokens, "
    r"(?P<gen_reqs>\d+) generation requests, (?P<gen_tokens>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?, "
    r"(?P<device>\w+) KV cache usage: (?P<kv>[\d.]+)%"
)
_CAP_SIZE = re.compile(rf"(?P<device>\w+) KV cache size: {_NUM} tokens")
_CAP_CONC = re.compile(rf"Maximum concurrency for {_NUM} tokens per request: (?P<conc>[\d.]+)x")
_CAP_BLOCKS = re.compile(r"# (?P<device>\w+) blocks: (?P<n>\d+)(?:, # CPU blocks: (?P<cpu>\d+))?")
_VERSION = re.compile(r"(?:vLLM API server version|\u2588\s+version)\s+(?P<v>\d+\.\d+[\w.+-]*)")
_ARGS = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
_SECRET = re.compile(r"key|token|secret|password|auth", re.IGNORECASE)  # never kept in clear
_MAX_ARGS_CHARS = 20_000  # a launch line longer than this is not read (literal_eval is costly)

# Substrings that every line we parse contains; chosen to be rare in other lines.
_NEEDLES = ("is preempted by", "KV cache usage:", "KV cache size:", "Maximum concurrency for",
            " blocks: ", "API server version", "\u2588  version", "non-default args: ",
            *INCIDENT_NEEDLES)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PreemptionWarning:
    """V0's warning. `cumulative` is the server's running total; warnings come every 50th time."""

    request_id: str
    mode: str
    cumulative: int
    logged_at: str | None = None
    kind: str = "preemption_warning"


@dataclass(frozen=True, slots=True)
class StatsLine:
    """A periodic stats line. Fractions are 0..1; `engine` is "000"-style, "all" if aggregated."""

    era: str  # "v1" or "v0"
    engine: str | None
    prompt_tps: float
    generation_tps: float
    running: int
    waiting: int
    kv_usage: float
    device: str
    deferred: int | None = None
    preemptions: int | None = None  # per interval (V1 0.11.1+; printed only once upstream fixes it)
    prefix_hit_rate: float | None = None
    swapped: int | None = None  # V0
    cpu_kv_usage: float | None = None  # V0
    engines: int = 1
    # 0.33 with a KV connector: requests fetching KV (waiting to start, in progress, done)
    kv_fetch: tuple[int, int, int] | None = None
    logged_at: str | None = None
    kind: str = "stats"


@dataclass(frozen=True, slots=True)
class IterationLine:
    """0.33's per-step line (`--enable-logging-iteration-details`): KV usage every step."""

    engine: str | None
    index: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float
    dummy: bool
    device: str
    kv_usage: float
    logged_at: str | None = None
    kind: str = "iteration"


@dataclass(frozen=True, slots=True)
class Capacity:
    """Startup KV capacity. Fields a given era does not print are None."""

    device: str | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    logged_at: str | None = None
    kind: str = "capacity"


@dataclass(frozen=True, slots=True)
class ServerStart:
    """A server (re)starting: its version from the banner, or the settings it was given beyond
    vLLM's defaults (one line each in the log; None where this line does not say)."""

    version: str | None = None
    args: tuple[tuple[str, str], ...] | None = None  # (name, value as written), sorted
    logged_at: str | None = None
    kind: str = "server_start"


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line in one of the shapes kvwatch reads whose numbers do not parse, or say the
    impossible (KV usage above 100%): skipped, and counted by whoever reads the events."""

    reason: str
    logged_at: str | None = None
    kind: str = "malformed"


LogEvent = (
    PreemptionWarning
    | StatsLine
    | IterationLine
    | Capacity
    | ServerStart
    | Malformed
    | IncidentLine
)


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _opt_int(s: str | None) -> int | None:
    return None if s is None else int(s)


def _stamp(line: str, end: int) -> str | None:
    m = _TIME.search(line, 0, end)
    return m.group(1) if m else None


def parse_line(line: str) -> LogEvent | None:
    """The event in one log line, or None if it is not one kvwatch reads; never raises: a line
    whose numbers are broken or impossible is a `Malformed` event."""
    try:
        ev = _parse_line(line)
    except (ValueError, OverflowError) as e:  # "1..0", 5,000 digits, inf
        return Malformed(f"unreadable number ({str(e)[:80]})", _stamp(line, len(line)))
    if ev is None:
        return None
    why = _impossible(ev)
    return ev if why is None else Malformed(why, ev.logged_at)


def _impossible(ev: LogEvent) -> str | None:
    """Why the event cannot be true, if it cannot."""
    if isinstance(ev, StatsLine):
        rates = (ev.prompt_tps, ev.generation_tps)
        if not all(math.isfinite(r) for r in rates):
            return "a throughput that is not finite"
        fractions = (ev.kv_usage, ev.prefix_hit_rate, ev.cpu_kv_usage)
        if any(f is not None and not 0.0 <= f <= 1.0 for f in fractions):
            return "a usage or hit rate above 100%"
    elif isinstance(ev, IterationLine):
        if not 0.0 <= ev.kv_usage <= 1.0:
            return "a usage or hit rate above 100%"
        if not math.isfinite(ev.elapsed_ms):
            return "a step time that is not finite"
    elif (
        isinstance(ev, Capacity)
        and ev.max_concurrency is not None
        and not math.isfinite(ev.max_concurrency)
    ):
        return "a concurrency that is not finite"
    return None


def _server_start(line: str) -> LogEvent | None:
    m = _VERSION.search(line)
    if m:
        return ServerStart(version=m["v"], logged_at=_stamp(line, m.start()))
    m = _ARGS.search(line)
    if m is None:
        return None
    text = m["args"]
    if len(text) > _MAX_ARGS_CHARS:
        return Malformed("non-default args too long to read", _stamp(line, m.start()))
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return Malformed("non-default args that are not a literal", _stamp(line, m.start()))
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return Malformed("non-default args that are not a mapping", _stamp(line, m.start()))
    args = tuple(
        sorted((k, "<redacted>" if _SECRET.search(k) else repr(v)[:200]) for k, v in value.items())
    )
    return ServerStart(args=args, logged_at=_stamp(line, m.start()))


def _parse_line(line: str) -> LogEvent | None:
    if "version" in line or "non-default args: " in line:
        ev = _server_start(line)
        if ev is not None:
            return ev
    if "is preempted by" in line:
        m = _PREEMPT.search(line)
        if m:
            return PreemptionWarning(
                m["id"], m["mode"].upper(), int(m["n"]), _stamp(line, m.start())
            )
        return None
    if "KV cache usage:" in line:
        if "Iteration(" in line:
            m = _ITERATION.search(line)
            if m:
                return IterationLine(
                    engine=m["engine"],
                    index=int(m["index"]),
                    context_requests=int(m["ctx_reqs"]),
                    context_tokens=int(m["ctx_tokens"]),
                    generation_requests=int(m["gen_reqs"]),
                    generation_tokens=int(m["gen_tokens"]),
                    elapsed_ms=float(m["ms"]),
                    dummy=m["dummy"] is not None,
                    device=m["device"],
                    kv_usage=float(m["kv"]) / 100.0,
                    logged_at=_stamp(line, m.start()),
                )
        m = _V1_STATS.search(line)
        if m:
            agg = m["agg"]
            return StatsLine(
                era="v1",
                engine="all" if agg else m["engine"],
                prompt_tps=float(m["prompt"]),
                generation_tps=float(m["gen"]),
                running=int(m["running"]),
                waiting=int(m["waiting"]),
                kv_usage=float(m["kv"]) / 100.0,
                device=m["device"],
                deferred=_opt_int(m["deferred"]),
                preemptions=_opt_int(m["preempt"]),
                prefix_hit_rate=None if m["hit"] is None else float(m["hit"]) / 100.0,
                engines=int(agg) if agg else 1,
                kv_fetch=None
                if m["fetch_wait"] is None
                else (int(m["fetch_wait"]), int(m["fetch_run"]), int(m["fetch_done"])),
                logged_at=_stamp(line, m.start()),
            )
        m = _V0_STATS.search(line)
        if m:
            return StatsLine(
                era="v0",
                engine=None,
                prompt_tps=float(m["prompt"]),
                generation_tps=float(m["gen"]),
                running=int(m["running"]),
                waiting=int(m["waiting"]),
                kv_usage=float(m["kv"]) / 100.0,
                device="GPU",
                swapped=int(m["swapped"]),
                cpu_kv_usage=float(m["cpukv"]) / 100.0,
                logged_at=_stamp(line, m.start()),
            )
        return None
    size = _CAP_SIZE.search(line) if "KV cache size:" in line else None
    conc = _CAP_CONC.search(line) if "Maximum concurrency for" in line else None
    if size or conc:
        first = size or conc
        assert first is not None
        return Capacity(
            device=size["device"] if size else None,
            kv_tokens=_int(size.group(2)) if size else None,
            max_model_len=_int(conc.group(1)) if conc else None,
            max_concurrency=float(conc["conc"]) if conc else None,
            logged_at=_stamp(line, first.start()),
        )
    if " blocks: " in line:
        m = _CAP_BLOCKS.search(line)
        if m:
            return Capacity(
                device=m["device"],
                gpu_blocks=int(m["n"]),
                cpu_blocks=_opt_int(m["cpu"]),
                logged_at=_stamp(line, m.start()),
            )
    return incident_line(line)


def _candidate_starts(text: str) -> list[int]:
    """Start offsets of the lines that contain any needle, in order, each once."""
    starts: set[int] = set()
    for needle in _NEEDLES:
        find, pos = text.find, 0
        while True:
            i = find(needle, pos)
            if i == -1:
                break
            start = text.rfind("\n", 0, i) + 1
            starts.add(start)
            end = text.find("\n", i)
            pos = len(text) if end == -1 else end
    return sorted(starts)


def parse_text(text: str) -> Iterator[LogEvent]:
    """Events in a chunk of log text (whole lines), in order."""
    for start in _candidate_starts(text):
        end = text.find("\n", start)
        event = parse_line(text[start:] if end == -1 else text[start:end])
        if event is not None:
            yield event


def event_to_dict(event: LogEvent) -> dict[str, Any]:
    return asdict(event)
