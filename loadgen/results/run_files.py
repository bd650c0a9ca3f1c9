"""A run directory read once, as typed values: what the report, the advice and the calibration
take from a load run, so no reader outside loadgen walks its JSON.

Every file passes run_schema's check first (a field of the wrong type is absent and counted);
the values here hold only what a reader uses, each field typed. The summary's parts that
loadgen alone knows how to say (a trace replay, a session run's working set) arrive as the
lines loadgen prints for them, or as None with `unreadable` set where a hand-edited file broke
them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.loadgen.results.replay_text import render_replay
from kvwatch.loadgen.results.run_schema import (
    EVENT,
    RECORD,
    SPEC,
    SUMMARY,
    TIMELINE_ROW,
    Cleaned,
    clean,
)
from kvwatch.loadgen.results.rundir import read_jsonl, read_records
from kvwatch.loadgen.results.stall_causes import CAUSES
from kvwatch.loadgen.results.working_set import render_working_set

__all__ = [
    "Percentiles", "ServerTimings", "Figures", "ServerDelta", "EngineStatus", "Incident",
    "SidecarSummary", "TurnFigures", "SessionsSummary", "RunSummary", "StageSpec", "CacheConfig",
    "ServerSnapshot", "RunSpec", "Record", "StageEvent", "TimelineRow", "DeliveredAlert",
    "RunFiles", "read_run", "workload_rows",
]  # fmt: skip


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _text(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    return v if isinstance(v, str) else None


def _obj(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


@dataclass(frozen=True)
class Percentiles:
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, d: Mapping[str, Any], key: str) -> Percentiles | None:
        v = d.get(key)
        if not isinstance(v, dict):
            return None
        return cls(_num(v, "p50"), _num(v, "p90"), _num(v, "p99"))


@dataclass(frozen=True)
class ServerTimings:
    """vLLM's own timings of the same requests (`--enable-per-request-metrics`)."""

    queue_time: Percentiles | None
    ttft_after_queue: Percentiles | None
    client_overhead: Percentiles | None


@dataclass(frozen=True)
class Figures:
    """A group's figures in the summary: the run's overall, a stage's, a priority class's."""

    requests: float | None = None
    completed: float | None = None
    failed: float | None = None
    duration_s: float | None = None
    output_token_throughput: float | None = None
    ttft: Percentiles | None = None
    itl: Percentiles | None = None
    e2e: Percentiles | None = None
    dispatch_lag: Percentiles | None = None
    stalls: float | None = None
    requests_with_stalls: float | None = None
    stalls_preempting: float | None = None
    # cause -> (stalls, seconds), the causes in stall_causes.CAUSES order; empty: not judged
    stall_causes: tuple[tuple[str, float, float], ...] = ()
    server_timings: ServerTimings | None = None

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Figures:
        t = d.get("server_timings")
        timings = (
            ServerTimings(
                Percentiles.of(t, "queue_time"),
                Percentiles.of(t, "ttft_after_queue"),
                Percentiles.of(t, "client_overhead"),
            )
            if isinstance(t, dict)
            else None
        )
        return cls(
            requests=_num(d, "requests"),
            completed=_num(d, "completed"),
            failed=_num(d, "failed"),
            duration_s=_num(d, "duration_s"),
            output_token_throughput=_num(d, "output_token_throughput"),
            ttft=Percentiles.of(d, "ttft"),
            itl=Percentiles.of(d, "itl"),
            e2e=Percentiles.of(d, "e2e"),
            dispatch_lag=Percentiles.of(d, "dispatch_lag"),
            stalls=_num(d, "stalls"),
            requests_with_stalls=_num(d, "requests_with_stalls"),
            stalls_preempting=_num(d, "stalls_preempting"),
            stall_causes=_causes(d.get("stall_causes")),
            server_timings=timings,
        )


def _causes(d: Any) -> tuple[tuple[str, float, float], ...]:
    """The summary's stalls by cause; causes it does not know, or of the wrong shape, left out."""
    if not isinstance(d, dict):
        return ()
    out = []
    for cause in CAUSES:
        v = d.get(cause)
        if isinstance(v, dict):
            n, sec = _num(v, "stalls"), _num(v, "seconds")
            if n is not None and sec is not None:
                out.append((cause, n, sec))
    return tuple(out)


def _groups(d: Any) -> tuple[tuple[str, Figures], ...]:
    """Named groups of figures (stages, classes, probe stages), in the file's order."""
    if not isinstance(d, dict):
        return ()
    return tuple((str(k), Figures.of(v)) for k, v in d.items() if isinstance(v, dict))


@dataclass(frozen=True)
class ServerDelta:
    """What the server's counters moved by over the run."""

    preemptions: float | None = None
    repeat_preempted: float | None = None
    admission_rejections: float | None = None
    offload_allocation_failures: float | None = None
    prompt_tokens_cached: float | None = None
    prompt_tokens_computed: float | None = None
    prompt_tokens: float | None = None  # every client's, not only the run's
    finished_requests: float | None = None


@dataclass(frozen=True)
class EngineStatus:
    target: str
    status: str | None
    reason: str | None


@dataclass(frozen=True)
class Incident:
    at: str | None
    what: str | None
    detail: str | None
    cause: str | None


@dataclass(frozen=True)
class SidecarSummary:
    """What the sidecar given to the run (`--sidecar`) said at its end."""

    engines: tuple[EngineStatus, ...]
    incidents: tuple[Incident, ...]


@dataclass(frozen=True)
class TurnFigures:
    turn: str
    requests: float | None
    prompt_tokens_mean: float | None
    ttft: Percentiles | None


@dataclass(frozen=True)
class SessionsSummary:
    sessions: float | None
    cut: float | None
    turns: tuple[TurnFigures, ...]
    working_set: str | None  # loadgen's paragraph; None when absent or unreadable
    working_set_unreadable: bool = False


@dataclass(frozen=True)
class RunSummary:
    overall: Figures
    stages: tuple[tuple[str, Figures], ...]
    classes: tuple[tuple[str, Figures], ...]  # priority class -> its figures
    probe_stages: tuple[tuple[str, Figures], ...]  # bystander probes, per stage
    server: ServerDelta
    sidecar: SidecarSummary | None  # None: no sidecar was given to the run
    sessions: SessionsSummary | None
    trace: tuple[str, ...] | None  # the replay as loadgen says it; None: no trace replayed
    trace_unreadable: bool
    time_scale: float  # a twin's: its figures are in simulated time / this


@dataclass(frozen=True)
class StageSpec:
    name: str
    pattern: str | None
    label: str  # the load in a user's words (its name where the run predates labels)
    duration_s: float | None
    count: float | None
    warmup: bool


@dataclass(frozen=True)
class CacheConfig:
    block_size: float | None = None
    num_blocks: float | None = None
    kv_cache_memory_bytes: float | None = None
    gpu_memory_utilization: float | None = None
    kv_tokens: float | None = None
    sliding_window: float | None = None
    kv_offloading_gib: float | None = None
    cache_dtype: str | None = None
    ssm_state_dtype: str | None = None


@dataclass(frozen=True)
class ServerSnapshot:
    """The server as the run read it before or after the load."""

    version: str | None = None
    cache: CacheConfig = CacheConfig()
    preemption_buckets: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> ServerSnapshot:
        cache = _obj(d, "cache")
        buckets = d.get("preemption_buckets")
        return cls(
            _text(d, "version"),
            CacheConfig(
                block_size=_num(cache, "block_size"),
                num_blocks=_num(cache, "num_blocks"),
                kv_cache_memory_bytes=_num(cache, "kv_cache_memory_bytes"),
                gpu_memory_utilization=_num(cache, "gpu_memory_utilization"),
                kv_tokens=_num(cache, "kv_tokens"),
                sliding_window=_num(cache, "sliding_window"),
                kv_offloading_gib=_num(cache, "kv_offloading_gib"),
                cache_dtype=_text(cache, "cache_dtype"),
                ssm_state_dtype=_text(cache, "ssm_state_dtype"),
            ),
            tuple(
                (float(b[0]), float(b[1]))
                for b in (buckets if isinstance(buckets, list) else ())
                if len(b) == 2 and None not in b
            ),
        )


@dataclass(frozen=True)
class RunSpec:
    target: str | None
    model: str | None
    start_unix: float | None
    stages: tuple[StageSpec, ...]
    workload_rows: tuple[tuple[str, str], ...]  # the workload in words: (what, plain text)
    server_before: ServerSnapshot
    server_after: ServerSnapshot


@dataclass(frozen=True)
class Record:
    """One request as the run recorded it (seconds from the run's start)."""

    ok: bool
    stage: str
    warmup: bool
    probe: bool
    sent_at: float | None
    finished_at: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    max_gap: float | None
    stalls: float | None
    prompt_tokens: float | None
    output_tokens: float | None
    expected_input_tokens: float | None
    expected_output_tokens: float | None


@dataclass(frozen=True)
class StageEvent:
    event: str | None
    stage: str
    t: float


@dataclass(frozen=True)
class TimelineRow:
    """The server's /metrics at unix time `t` (and the sidecar's state, with --sidecar)."""

    t: float
    kv_usage: float | None
    running: float | None
    waiting: float | None
    preemptions_total: float | None
    state: str | None


@dataclass(frozen=True)
class DeliveredAlert:
    """One webhook delivery the demo's receiver got (alerts.jsonl keeps the payloads)."""

    starts_at: str
    status: str
    repeat: bool
    alertname: str | None
    summary: str | None


@dataclass(frozen=True)
class RunFiles:
    """A run directory as its readers see it, read once per command."""

    directory: Path
    spec: RunSpec
    summary: RunSummary
    records: tuple[Record, ...]
    events: tuple[StageEvent, ...]  # those with a stage and a time
    timeline: tuple[TimelineRow, ...]  # those with a time
    alerts: tuple[DeliveredAlert, ...]
    dropped: int  # values of the wrong type left out


def read_run(run_dir: Path) -> RunFiles:
    """Read and check a run directory. ValueError, one line: not a run directory (a file is
    missing or unreadable), or a file that is not JSON."""

    def optional(name: str) -> list[Any]:
        path = run_dir / name
        return read_jsonl(path) if path.exists() else []

    try:
        spec = json.loads((run_dir / "spec.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        records = read_records(run_dir)
        events, timeline = optional("events.jsonl"), optional("timeline.jsonl")
        alerts = optional("alerts.jsonl")
    except OSError as e:
        raise ValueError(f"{run_dir} is not a run directory ({e.strerror}: {e.filename})") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{run_dir}: unreadable run files ({str(e)[:200]})") from None
    count = Cleaned()
    s = clean(spec, SPEC, count)
    return RunFiles(
        directory=run_dir,
        spec=_spec(s),
        summary=_summary(clean(summary, SUMMARY, count)),
        records=tuple(_record(r) for r in clean(records, [RECORD], count) if r),
        events=tuple(
            StageEvent(_text(e, "event"), str(e["stage"]), float(e["t"]))
            for e in clean(events, [EVENT], count)
            if e and e.get("stage") and _num(e, "t") is not None
        ),
        timeline=tuple(
            row for r in clean(timeline, [TIMELINE_ROW], count) if r and (row := _row(r))
        ),
        alerts=tuple(_alert(a) for a in alerts if isinstance(a, dict)),
        dropped=count.dropped,
    )


def _row(r: dict[str, Any]) -> TimelineRow | None:
    t = _num(r, "t")
    if t is None:
        return None
    return TimelineRow(
        t, _num(r, "kv_usage"), _num(r, "running"), _num(r, "waiting"),
        _num(r, "preemptions_total"), _text(r, "state"),
    )  # fmt: skip


def _record(r: dict[str, Any]) -> Record:
    return Record(
        r.get("ok") is True,
        str(r.get("stage") or ""),
        r.get("warmup") is True,
        r.get("probe") is True,
        *(_num(r, k) for k in ("sent_at", "finished_at", "ttft", "tpot", "e2e", "max_gap",
                               "stalls", "prompt_tokens", "output_tokens",
                               "expected_input_tokens", "expected_output_tokens")),
    )  # fmt: skip


def _alert(a: dict[str, Any]) -> DeliveredAlert:
    annotations = _obj(a, "annotations")
    return DeliveredAlert(
        str(a.get("starts_at") or "")[:19].replace("T", " "),
        str(a.get("status") or ""),
        a.get("repeat") is True,
        None if a.get("alertname") is None else str(a.get("alertname")),
        None if annotations.get("summary") is None else str(annotations["summary"]),
    )


def _spec(s: dict[str, Any]) -> RunSpec:
    stages = tuple(
        StageSpec(
            st["name"],
            _text(st, "pattern"),
            _text(st, "label") or st["name"],
            _num(st, "duration_s"),
            _num(st, "count"),
            st.get("warmup") is True,
        )  # fmt: skip
        for st in s.get("stages") or []
        if isinstance(st, dict) and isinstance(st.get("name"), str) and st["name"]
    )
    return RunSpec(
        _text(s, "target"),
        None if s.get("model") is None else str(s["model"]),
        _num(s, "start_unix"),
        stages,
        workload_rows(s),
        ServerSnapshot.of(_obj(s, "server_before")),
        ServerSnapshot.of(_obj(s, "server_after")),
    )


def workload_rows(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The workload as rows of words: what the prompts were, not the file's JSON."""
    w = _obj(spec, "workload")
    shown = [
        ("prompts from", w.get("dataset")),
        ("trace replayed", w.get("trace")),
        ("trace format", w.get("format")),
        ("trace speed", w.get("speed")),
        ("trace lengths x", w.get("length_scale")),
        ("sessions", "conversations" if w.get("sessions") else None),
        ("turns per session", w.get("turns")),
        ("think time (s)", w.get("think_time_s")),
        ("calls per turn", w.get("fanout") if (w.get("fanout") or 1) != 1 else None),
        ("prompt tokens" if not w.get("sessions") else "opening tokens", w.get("input_len")),
        ("new message tokens", w.get("turn_input_len")),
        ("output tokens", w.get("output_len")),
    ]
    if w.get("token_exact") is not None:
        exact = "exact (token ids)" if w["token_exact"] else "approximate (text, re-tokenized)"
        shown.append(("lengths", exact))
    if w.get("shared_prefix"):  # groups only mean something with a shared prefix
        shown += [("shared prefix", f"{w['shared_prefix']} tokens"),
                  ("prefix groups", w.get("prefix_groups"))]  # fmt: skip
    rows = [(label, str(v)) for label, v in shown if v not in (None, "")]
    api = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
    if spec.get("endpoint") in api:
        rows.append(("API", api[spec["endpoint"]]))
    if isinstance(spec.get("ignore_eos"), bool):
        rows.append(("stops at EOS", "no (ignore_eos)" if spec["ignore_eos"] else "yes"))
    if spec.get("seed") is not None:
        rows.append(("seed", str(spec["seed"])))
    return tuple(rows)


def _summary(s: dict[str, Any]) -> RunSummary:
    trace: tuple[str, ...] | None = None
    trace_unreadable = False
    if isinstance(s.get("trace"), dict):
        try:
            trace = tuple(render_replay(s["trace"]).splitlines())
        except (KeyError, TypeError, ValueError, AttributeError):
            trace_unreadable = True
    scale = _num(s, "time_scale")
    probes = _obj(s, "probes")
    return RunSummary(
        overall=Figures.of(_obj(s, "overall")),
        stages=_groups(s.get("stages")),
        classes=_groups(s.get("classes")),
        probe_stages=_groups(probes.get("stages")),
        server=ServerDelta(**{k: _num(_obj(s, "server"), k) for k in (
            "preemptions", "repeat_preempted", "admission_rejections",
            "offload_allocation_failures", "prompt_tokens_cached", "prompt_tokens_computed",
            "prompt_tokens", "finished_requests")}),
        sidecar=_sidecar(s.get("sidecar")),
        sessions=_sessions(s.get("sessions")),
        trace=trace,
        trace_unreadable=trace_unreadable,
        time_scale=scale if scale is not None and 0 < scale < 1e6 else 1.0,
    )  # fmt: skip


def _sidecar(side: Any) -> SidecarSummary | None:
    if not isinstance(side, dict) or not side:
        return None
    engines = side.get("engines")
    return SidecarSummary(
        tuple(
            EngineStatus(str(t), _text(e, "status"), _text(e, "reason"))
            for t, e in (engines.items() if isinstance(engines, dict) else ())
            if isinstance(e, dict)
        ),
        tuple(
            Incident(*(_text(i, k) for k in ("at", "what", "detail", "cause")))
            for i in side.get("incidents") or []
            if isinstance(i, dict)
        ),
    )


def _sessions(s: Any) -> SessionsSummary | None:
    if not isinstance(s, dict) or not isinstance(s.get("turns"), dict):
        return None
    turns = tuple(
        TurnFigures(
            str(t), _num(v, "requests"), _num(v, "prompt_tokens_mean"), Percentiles.of(v, "ttft")
        )  # fmt: skip
        for t, v in s["turns"].items()
        if isinstance(v, dict)
    )
    ws, unreadable = None, False
    if isinstance(s.get("working_set"), dict):
        try:
            ws = render_working_set(s["working_set"])
        except (KeyError, TypeError, ValueError, AttributeError):
            unreadable = True
    return SessionsSummary(_num(s, "sessions"), _num(s, "cut"), turns, ws, unreadable)
