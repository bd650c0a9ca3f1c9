"""Mutations of real vLLM output, and the properties every input must keep, for the fuzz tests
(hypothesis, in CI) and bench/bench_fuzz.py (10^5 cases). A property that fails raises."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.sidecar.logs.follow import FollowStats, LineSplitter
from kvwatch.sidecar.logs.logformats import Malformed, StatsLine, parse_line
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.outputs.exporter import StateCollector
from kvwatch.sidecar.state.sidecar_state import SidecarState

__all__ = [
    "METRIC_LINES", "LOG_LINES", "mutate", "check_exposition", "check_log_line",
    "check_splitter", "trace_text", "check_trace", "check_prometheus_answers",
    "check_sidecar_state",
]  # fmt: skip

DATA = Path(__file__).resolve().parent / "data"
METRIC_LINES = [
    line
    for line in (DATA / "vllm-0.32-metrics-busy.txt").read_text().splitlines()
    if line.startswith("vllm:") and "_bucket" not in line
]
LOG_LINES = [
    line
    for line in (DATA / "vllm-0.32-cpu-server.log").read_text().splitlines()
    if "KV cache" in line or "blocks" in line or "concurrency" in line
]
_JUNK = ["NaN", "+Inf", "-Inf", "-1", "1e300", "1e12", "..", "1..0", "9" * 5000, "", " ", "{", "}",
         '"', "\\", ",", "=", "#", "\x00", "\u00e9", "0x1f", "1_000", "%", "e9"]  # fmt: skip


def mutate(text: str, rng: random.Random) -> str:
    """One to three edits: a character replaced, a junk token spliced in, a cut, a repeat."""
    for _ in range(rng.randint(1, 3)):
        if not text:
            return rng.choice(_JUNK)
        i = rng.randrange(len(text))
        op = rng.randrange(4)
        if op == 0:
            text = text[:i] + chr(rng.randrange(32, 127)) + text[i + 1 :]
        elif op == 1:
            text = text[:i] + rng.choice(_JUNK) + text[i:]
        elif op == 2:
            text = text[:i]
        else:
            text = text[:i] + text[i:] * 2
    return text


def check_exposition(lines: list[str]) -> None:
    """Parsed, observed, judged twice and exported: nothing raises, and every exported value
    is finite and not negative."""
    state = SidecarState(["http://a"])
    for t in (1.0, 2.0):
        exp = parse_exposition("\n".join(lines))
        state.record_scrape("http://a", t, ScrapeOutcome(0.01, exp))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(lambda: state.view(2.0)))
    for line in generate_latest(reg).decode().splitlines():
        if not line.startswith("#"):
            value = float(line.rpartition(" ")[2])
            assert math.isfinite(value) and value >= 0, line


def check_log_line(line: str) -> None:
    """A line gives no event, a malformed one, or one whose figures can be true."""
    ev = parse_line(line)
    if isinstance(ev, StatsLine):
        assert 0 <= ev.kv_usage <= 1 and ev.running >= 0 and ev.waiting >= 0, line
        assert math.isfinite(ev.generation_tps) and math.isfinite(ev.prompt_tps), line
        assert ev.prefix_hit_rate is None or 0 <= ev.prefix_hit_rate <= 1, line
    assert ev is None or isinstance(ev, Malformed) or ev.kind in (
        "stats", "capacity", "preemption_warning", "server_start", "iteration"
    )  # fmt: skip


def check_splitter(data: bytes, cuts: list[int]) -> None:
    """Fed in any chunks, the splitter gives back the complete lines, in order."""
    split = LineSplitter(FollowStats())
    got: list[str] = []
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        got += split.feed(data[last:cut])
        last = cut
    got += split.flush()
    want = data.decode("utf-8", "replace").split("\n")
    if want and want[-1] == "":
        want.pop()
    assert got == want, (got[:3], want[:3])


# --- traces: rows of the three formats with fields made hostile --------------------------

TRACES = DATA / "traces"
_HOSTILE_VALUES: list[object] = [
    None, True, -1, 0, 1, 2**31, 2**63, 2**64, 10**400, -(10**400), 1e308, float("nan"),
    float("inf"), 0.5, "12", "", [], {}, [1, -2], [2**41], ["x"], 9.0,
]  # fmt: skip
_AZURE_CELLS = [
    "2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46+00:00", "2023-11-16T18:15:47Z",
    "2023-11-16 18:15:46.1+05:30", "9999-12-31 23:59:59", "0001-01-01", "yesterday", "",
    "374", "-3", "0", "1e3", str(10**30), "nan",
]  # fmt: skip


def trace_text(fmt: str, rng: random.Random) -> str:
    """A few rows of a real trace in `fmt`, some fields given hostile values, some lines
    mutated as text."""
    if fmt == "azure":
        lines = (TRACES / "azure-llm-conv-2023-first120.csv").read_text().splitlines()[:8]
        rows = [lines[0]]
        for line in lines[1:]:
            cells = line.split(",")
            if rng.random() < 0.5:
                cells[rng.randrange(len(cells))] = rng.choice(_AZURE_CELLS)
            rows.append(",".join(cells))
    else:
        src = (TRACES / "mooncake-conversation-first120.jsonl").read_text().splitlines()[:8]
        rows = []
        for line in src:
            rec = json.loads(line)
            if fmt == "kvwatch":
                rec = {"t": rec["timestamp"] / 1000, "input_tokens": rec["input_length"],
                       "output_tokens": rec["output_length"], "hash_ids": rec["hash_ids"][:4],
                       "priority": rng.randrange(-2, 3)}  # fmt: skip
            if rng.random() < 0.6:
                rec[rng.choice(sorted(rec))] = rng.choice(_HOSTILE_VALUES)
            rows.append(json.dumps(rec))
    rows = [mutate(r, rng) if rng.random() < 0.15 else r for r in rows]
    return "\n".join(rows) + "\n"


def check_trace(
    path: Path, fmt: str | None, speed: float, scale: float, speed_end: float | None = None
) -> None:
    """Read and planned: a TraceError of one line, or requests every later step can use."""
    from kvwatch.loadgen.workload.trace import (
        MAX_TOKENS,
        PRIORITY_RANGE,
        TraceError,
        plan_replay,
        read_trace,
    )

    try:
        trace = read_trace(path, fmt)
        plan = plan_replay(
            trace, speed=speed, length_scale=scale, max_model_len=4096, speed_end=speed_end
        )
    except TraceError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        return
    for r in trace.requests:
        assert math.isfinite(r.at_s), r
        assert 1 <= r.input_tokens <= MAX_TOKENS and 1 <= r.output_tokens <= MAX_TOKENS, r
        assert r.priority is None or PRIORITY_RANGE[0] <= r.priority <= PRIORITY_RANGE[1], r
    assert plan.offsets_s[0] == 0 and all(math.isfinite(o) for o in plan.offsets_s)
    assert list(plan.offsets_s) == sorted(plan.offsets_s)
    assert all(r.input_tokens + r.output_tokens <= 4096 + 1 for r in plan.requests)
    # a window read (rows outside it counted, not parsed) keeps exactly the whole read's rows
    # that fall in it
    times = sorted(r.at_s for r in trace.requests)
    lo = times[len(times) // 3]
    hi = lo + 1.0
    inside = [r for r in trace.requests if lo <= r.at_s < hi]
    try:
        windowed = read_trace(path, fmt, window_s=(lo, hi))
    except TraceError as e:
        assert not inside and "\n" not in str(e), (e, inside)
        return
    assert windowed.requests == tuple(inside)
    read = len(trace.requests) + sum(trace.skipped.values())
    assert windowed.outside_window + len(inside) <= read


# --- Prometheus API answers ---------------------------------------------------------------

_PROM_LABEL_VALUES: list[Any] = ["0", "1", "16", "4096", "1e9", "-5", "nan", "inf", "x", "",
                                 None, [], {}, 1, True, "fp8", "auto"]  # fmt: skip
_PROM_SAMPLES: list[Any] = ["1", "0", "12.5", "NaN", "+Inf", "-1", "1e308", "x", None, [], 7]
_PROM_LABELS = ["num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "gpu_memory_utilization",
                "cache_dtype", "kv_offloading_size", "mamba_ssm_cache_dtype"]  # fmt: skip
_GOOD_LABELS = {"num_gpu_blocks": "4000", "block_size": "16", "kv_cache_memory_bytes": "8e9"}


def _prom_failure(rng: random.Random, share: float) -> tuple[int, bytes] | None:
    """An answer that is no result, `share` of the time each kind: a 500 page, a refused query,
    a body of another shape; None for the rest."""
    pick = rng.random()
    if pick < share:
        return 500, b"<html>oops</html>"
    if pick < 2 * share:
        return 400, json.dumps({"status": "error", "error": "bad\nquery"}).encode()
    if pick < 2.6 * share:
        return 200, json.dumps(rng.choice([[], {}, {"status": "success"}, "x"])).encode()
    return None


def _prom_answer(rng: random.Random) -> tuple[int, bytes]:
    """A FAKE Prometheus API answer (in process: thousands a second, hostile on demand)."""
    failed = _prom_failure(rng, 0.05)
    if failed is not None:
        return failed
    rows: list[Any] = []
    for _ in range(rng.randrange(4)):
        metric: Any = {"instance": rng.choice(["a:1", "b:2"]), "engine": "0", **_GOOD_LABELS}
        for label in rng.sample(_PROM_LABELS, rng.randrange(3)):
            metric[label] = rng.choice(_PROM_LABEL_VALUES)
        if rng.random() < 0.05:
            metric = rng.choice([None, [], "x"])
        value = [1.0, rng.choice(_PROM_SAMPLES)] if rng.random() < 0.9 else rng.choice([[], None])
        rows.append({"metric": metric, "value": value} if rng.random() < 0.97 else 1)
    doc = {"status": "success", "data": {"resultType": "vector", "result": rows}}
    return 200, json.dumps(doc).encode()


def check_prometheus_answers(rng: random.Random) -> None:
    """`advise --prometheus` on any answer to each of its queries: advice for every engine it
    can read, or one SizingError/CliError line (the reader's errors as the command turns
    them); never a traceback or a figure not finite."""
    from kvwatch.advise.prometheus import observed_from_prometheus, prometheus_as_cli
    from kvwatch.common.cli_kit import CliError
    from kvwatch.sizing.advice import advise
    from kvwatch.sizing.errors import SizingError

    def answer(request: httpx.Request) -> httpx.Response:
        status, body = _prom_answer(rng)
        return httpx.Response(status, content=body)

    try:
        with prometheus_as_cli():
            got = observed_from_prometheus(
                "http://prometheus.fuzz:9090", transport=httpx.MockTransport(answer)
            )
        for _, obs in got:
            for name in ("capacity_blocks", "block_size", "kv_bytes_per_token", "peak_demand",
                         "seq_len_p95", "preemptions"):  # fmt: skip
                assert math.isfinite(getattr(obs, name)), (name, obs)
            advise(obs)
    except (SizingError, CliError) as e:
        assert "\n" not in str(e) and str(e)


_PROM_RANGE_GOOD = {  # a plausible increase over a slice, by the query's family
    "iteration_tokens_total_count": 200.0, "generation_tokens_total": 3000.0,
    "local_compute": 2000.0, "latency_seconds_sum": 2.0, "latency_seconds_count": 100.0,
    "preemptions": 0.0,
    "prompt_tokens_sum": 500.0, "generation_tokens_sum": 300.0, "tokens_count": 5.0,
}  # fmt: skip


def _prom_range_answer(rng: random.Random, query: str) -> tuple[int, bytes]:
    """A FAKE Prometheus range answer to a calibration query (in process, hostile on demand):
    series of one or two instances, plausible values with hostile ones among them."""
    failed = _prom_failure(rng, 0.01)  # thirteen queries: each fails less often
    if failed is not None:
        return failed
    good = next((v for k, v in _PROM_RANGE_GOOD.items() if k in query), 4.0)
    cumulative = "_over_time" not in query
    rows: list[Any] = []
    instances = ["a:1"] if rng.random() < 0.7 else ["a:1", "b:2"]
    for inst in instances:
        metric: Any = {"instance": inst, "engine": "0" if rng.random() < 0.9 else "1"}
        if rng.random() < 0.03:
            metric = rng.choice([None, [], "x"])
        values: Any = []
        total = 0.0  # a counter is read as its values, and its growth taken between them
        for t in range(rng.randrange(13) if rng.random() < 0.2 else 12):
            total += good * rng.uniform(0.2, 3)
            v: Any = (
                (total if cumulative else good * rng.uniform(0.2, 3))
                if rng.random() < 0.85
                else rng.choice(_PROM_SAMPLES)
            )
            pair: Any = [1000.0 + 10 * t, str(v) if not isinstance(v, list | None) else v]
            values.append(pair if rng.random() < 0.97 else rng.choice([[], None, [1], "x"]))
        if rng.random() < 0.03:
            values = rng.choice([None, {}, "x"])
        rows.append({"metric": metric, "values": values} if rng.random() < 0.97 else 1)
    doc = {"status": "success", "data": {"resultType": "matrix", "result": rows}}
    return 200, json.dumps(doc).encode()


def check_prometheus_calibration(rng: random.Random) -> None:
    """`calibrate --prometheus` on any answer to each of its range queries: slices and
    figures a fit can take (finite, positive, loads vLLM can have), or one line."""
    from kvwatch.advise.prometheus import prometheus_as_cli
    from kvwatch.advise.server_readings import slices_from_prometheus
    from kvwatch.common.cli_kit import CliError
    from kvwatch.sizing.errors import SizingError
    from kvwatch.timing.server_slices import figures_from_slices

    def answer(request: httpx.Request) -> httpx.Response:
        status, body = _prom_range_answer(rng, request.url.params.get("query", ""))
        return httpx.Response(status, content=body)

    try:
        with prometheus_as_cli():
            got, notes = slices_from_prometheus(
                "http://prometheus.fuzz:9090", 120.0, 10.0, rng.choice([None, "a:1"]),
                end=1100.0, transport=httpx.MockTransport(answer),
            )  # fmt: skip
    except (SizingError, CliError) as e:
        assert "\n" not in str(e) and str(e)
        return
    assert all("\n" not in n for n in notes)
    for slices in got.values():
        figures, skipped = figures_from_slices(slices, 8192, 256)
        assert all("\n" not in s for s in skipped)
        for f in figures:
            assert math.isfinite(f.value) and f.value > 0, f
            assert f.load.concurrency >= 1 and f.load.input_len >= 1 and f.load.output_len >= 2


def _readings_doc() -> Any:
    """A real /api/readings document whose counters grow: a sidecar's readings of vLLM's busy
    body, each later one's counters larger, so its slices make figures."""
    from kvwatch.sidecar.contract.readings import FIELDS
    from kvwatch.sidecar.state.sidecar_state import SidecarState

    body = (DATA / "vllm-0.32-metrics-busy.txt").read_text()
    state = SidecarState(["http://a"])
    state.record_scrape("http://a", 0.0, ScrapeOutcome(0.01, parse_exposition(body)))
    doc = json.loads(json.dumps(state.readings_json()))
    row = doc["engines"][0]["readings"][0]
    still = {FIELDS.index("held"), FIELDS.index("preemptions")}  # a steady load, no preemption
    doc["engines"][0]["readings"] = [
        [float(t), *[v if i in still or v is None else v * (1 + t / 10)
                     for i, v in enumerate(row[1:], 1)]]
        for t in range(40)
    ]  # fmt: skip
    return doc


_READINGS_DOC: list[Any] = []


def check_sidecar_readings(rng: random.Random) -> None:
    """`calibrate --sidecar` on a sidecar's /api/readings with one to three fields given any
    value: figures a fit can take, or one ReadingsError line."""
    from kvwatch.sidecar.contract.readings import FIELDS, ReadingsError, readings_from_json
    from kvwatch.timing.server_slices import figures_from_slices, slices_from_readings

    if not _READINGS_DOC:
        _READINGS_DOC.append(_readings_doc())
    doc = json.loads(json.dumps(_READINGS_DOC[0]))
    places = _places(doc)
    width = len(FIELDS)
    places += [("engines", 0, "readings", rng.randrange(40), rng.randrange(width))
               for _ in range(9)]  # fmt: skip
    _spoil(doc, places, rng, rng.randint(1, 3))
    try:
        per_engine, scales = readings_from_json(doc)
    except ReadingsError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert all(0 < k < 1e6 for k in scales.values())
    for readings in per_engine.values():
        slices, skipped = slices_from_readings(readings, rng.choice([1.0, 5.0]))
        figures, why = figures_from_slices(slices, 8192, 256)
        assert all("\n" not in w for w in skipped + why)
        for f in figures:
            assert math.isfinite(f.value) and f.value > 0, f


# --- another sidecar's /api/state (advise --sidecar) ----------------------------------------

_STATE_WRONG: list[Any] = ["x", None, [], {}, -1, 0, True, 1e308, float("nan"), float("inf"),
                           2**70, "1e400"]  # fmt: skip


def _state_doc() -> Any:
    """A real /api/state document: a sidecar's state after two scrapes of vLLM's busy body."""
    from kvwatch.sidecar.kvevents.sequence import FeedStats
    from kvwatch.sidecar.kvevents.wire import Batch, Stored, block_key
    from kvwatch.sidecar.state.sidecar_state import SidecarState
    from kvwatch.sidecar.state.views import state_json

    body = (DATA / "vllm-0.32-metrics-busy.txt").read_text()
    state = SidecarState(["http://a", "http://b"])
    for url in ("http://a", "http://b"):  # both followed: a curve each and the fleet's
        state.follow_kv_events(url, FeedStats())
        for t in (1.0, 2.0):
            state.record_scrape(url, t, ScrapeOutcome(0.01, parse_exposition(body)))
        for i in range(30):
            keys = (block_key(0, i % 7), block_key(0, 100 + i))
            state.record_kv_batch(url, Batch(10.0 * i, (Stored(keys, None),), 0))
    return json.loads(json.dumps(state_json(state.view(2.0))))


_STATE_DOC: list[Any] = []


def _spoil(doc: Any, places: list[tuple[Any, ...]], rng: random.Random, times: int) -> None:
    """Give `times` of the document's places (paths of keys and indices) a wrong value each."""
    for _ in range(times):
        at = rng.choice(places)
        node = doc
        try:
            for k in at[:-1]:
                node = node[k]
            # a copy: a shared [] or {} given a value later would tie the documents together
            node[at[-1]] = copy.deepcopy(rng.choice(_STATE_WRONG))
        except (KeyError, IndexError, TypeError):
            continue  # a container above it was replaced already


def _places(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at] if at else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _places(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            out += _places(v, (*at, i))
    return out


def check_sidecar_state(rng: random.Random) -> None:
    """`advise --sidecar` on another sidecar's /api/state with one to three fields given any
    value: advice, or one ValueError/SizingError line; never a traceback or an unfinite figure."""
    from kvwatch.advise.sources import observed_from_engines
    from kvwatch.sidecar.state.views import (
        engines_from_json,
        fleet_prefix_from_json,
        prefix_curves_from_json,
        servers_from_json,
    )
    from kvwatch.sizing.advice import advise
    from kvwatch.sizing.errors import SizingError

    if not _STATE_DOC:
        _STATE_DOC.append(_state_doc())
    doc = json.loads(json.dumps(_STATE_DOC[0]))
    places = _places(doc)
    _spoil(doc, places, rng, rng.randint(1, 3))
    try:
        engines = engines_from_json(doc)
        servers = servers_from_json(doc)
        curves, fleet = prefix_curves_from_json(doc), fleet_prefix_from_json(doc)
        server = next(iter(servers.values())) if len(servers) == 1 else None
        for _, obs in observed_from_engines(engines, "sidecar http://fuzz", curves, fleet):
            advise(obs, server=server)
    except (ValueError, SizingError) as e:
        assert "\n" not in str(e) and str(e), repr(e)


# --- a completion's streamed answer (HTTP/1.1 bytes, SSE lines, chunk JSON) ---------------

_CHUNK_WRONG: list[Any] = [-1, -(2**40), 2**63, 2**70, 1.5, "7", None, [], {}, True, "x\ny",
                           float("nan")]  # fmt: skip


def _completion_chunks(rng: random.Random) -> list[Any]:
    """vLLM-shaped chunks of a streamed completion, some fields made hostile."""
    out: list[Any] = []
    for i in range(rng.randrange(1, 8)):
        choice: dict[str, Any] = {"index": 0, "text": f"t{i}", "token_ids": [i, i + 1]}
        if rng.random() < 0.3:
            choice = {"index": 0, "delta": {"content": f"t{i}", "role": "assistant"}}
        out.append({"id": "cmpl-1", "choices": [choice]})
    usage: dict[str, Any] = {"prompt_tokens": 12, "completion_tokens": len(out)}
    timings = {"queue_time_ms": 1.5, "time_to_first_token_ms": 20}
    last: dict[str, Any] = {"choices": [], "usage": usage, "metrics": timings}
    out.append(last)
    for _ in range(rng.randrange(4)):
        target = rng.choice(out)
        where = rng.choice(["usage", "choices", "metrics", "error", "token_ids", "text"])
        value = rng.choice(_CHUNK_WRONG)
        if where in ("usage", "metrics") and isinstance(target.get(where), dict) and target[where]:
            target[where][rng.choice(list(target[where]))] = value
        elif (
            where in ("token_ids", "text")
            and isinstance(target.get("choices"), list)
            and (target["choices"] and isinstance(target["choices"][0], dict))
        ):
            target["choices"][0][where] = rng.choice([value, [value], [1, value]])
        else:
            target[where] = value
    return out


def sse_response(rng: random.Random) -> bytes:
    """A FAKE server's whole HTTP/1.1 answer to a streamed completion (in process, hostile on
    demand): chunked, Content-Length or read-until-close, an error status with a body of
    several lines, SSE lines broken, [DONE] missing."""
    status = rng.choice([200] * 8 + [400, 500, 503])
    if status != 200:
        body = b'{"error": "bad\nrequest\r\nsecond line"}'
    else:
        lines = []
        for c in _completion_chunks(rng):
            try:
                text = json.dumps(c, allow_nan=rng.random() < 0.5)
            except ValueError:
                text = "{"
            if rng.random() < 0.05:
                text = text[: rng.randrange(len(text) + 1)]  # cut mid-JSON
            lines.append(f"data: {text}")
        if rng.random() < 0.9:
            lines.append("data: [DONE]")
        sep = rng.choice(["\n\n", "\r\n\r\n", "\n"])
        body = (sep.join(lines) + sep).encode()
        if rng.random() < 0.05:
            body = body.replace(b"data:", rng.choice([b"dat:", b"data:data:", b"\x00"]), 1)
    framing = rng.choice(["chunked", "length", "close"])
    head = f"HTTP/1.1 {status} X\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        parts = [body[i : i + 37] for i in range(0, len(body), 37)]
        sizes = [format(len(p), "x") if rng.random() < 0.98 else rng.choice(["zz", "-1", ""])
                 for p in parts]  # fmt: skip
        payload = b"".join(
            f"{s}\r\n".encode() + p + b"\r\n" for s, p in zip(sizes, parts, strict=True)
        )
        raw = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + payload + b"0\r\n\r\n"
    elif framing == "length":
        raw = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    else:
        raw = (head + "Connection: close\r\n\r\n").encode() + body
    if rng.random() < 0.03:
        raw = raw[: rng.randrange(len(raw))]  # the connection cut short
    return raw


def check_streamed_answer(raw: bytes, cuts: list[int], want_ids: bool) -> None:
    """One answer fed to the load generator's parser split anywhere: the record ends with
    figures a run can keep (counts, times) or one error line; never an exception."""
    from kvwatch.loadgen.results.records import RequestRecord
    from kvwatch.loadgen.send.client import _StreamRecorder
    from kvwatch.loadgen.send.http1 import HttpProtocolError, ResponseParser

    rec = RequestRecord("r", 0.0, output_token_ids=[] if want_ids else None)
    sink = _StreamRecorder(rec)
    parser = ResponseParser(sink)
    error = None
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    try:
        for t, (a, b) in enumerate(zip(points, points[1:], strict=False)):
            parser.feed(raw[a:b], float(t))
            if parser.done:
                break
        else:
            parser.eof()
    except HttpProtocolError as e:
        error = f"HttpProtocolError: {e}"
    sink.end(error)
    assert rec.error is None or (rec.error and "\n" not in rec.error and "\r" not in rec.error)
    if rec.error is None:
        assert rec.status == 200
        for n in (rec.prompt_tokens, rec.output_tokens):
            assert n is None or (isinstance(n, int) and 0 <= n < 2**53), rec
        assert all(isinstance(i, int) and i >= 0 for i in rec.output_token_ids or ()), rec
        for s in (rec.server_queue_time, rec.server_ttft):
            assert s is None or 0 <= s < math.inf, rec
        assert rec.token_times == sorted(rec.token_times)


# --- the server's one-off answers: /v1/models, /tokenize, /version ------------------------

_ANSWER_WRONG: list[Any] = [None, [], {}, "x", 1, -1, True, 2**70, 1e308, [None], [{}], [1, "a"],
                            {"id": None}, [{"id": 7}], [{"id": ""}], [{"id": "m\nx"}]]  # fmt: skip


def server_answer(rng: random.Random, path: str) -> httpx.Response:
    """A FAKE vLLM's answer to one of the load generator's and the sidecar's one-off calls (in
    process, hostile on demand): the right shape, a field made wrong, or not that at all."""
    good: dict[str, Any] = {
        "/v1/models": {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]},
        "/tokenize": {"tokens": [1, 2, 3], "count": 3, "max_model_len": 4096},
        "/version": {"version": "0.32.0"},
    }[path]
    pick = rng.random()
    if pick < 0.1:
        return httpx.Response(rng.choice([404, 500, 503]), content=b"<html>no\n</html>")
    if pick < 0.2:
        return httpx.Response(200, content=rng.choice([b"", b"{", b"\xff\xfe", b"null", b"[]"]))
    doc = json.loads(json.dumps(good))
    if pick < 0.8:
        key = rng.choice(list(doc))
        if key == "data" and rng.random() < 0.5:
            doc["data"][0][rng.choice(["id", "max_model_len"])] = rng.choice(_ANSWER_WRONG)
        else:
            doc[key] = rng.choice(_ANSWER_WRONG)
    return httpx.Response(200, json=doc)


def check_server_answers(rng: random.Random) -> None:
    """`/v1/models` gives a model name or one line; its context length, `/tokenize`'s tokens
    and `/version`'s release are what the server said, or None: never an exception."""
    import asyncio

    from kvwatch.loadgen.send.client import max_model_len, served_model
    from kvwatch.loadgen.workload.spec import tokenize_corpus
    from kvwatch.sidecar.metrics.scrape import fetch_version

    def answer(request: httpx.Request) -> httpx.Response:
        return server_answer(rng, request.url.path)

    async def ask() -> None:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport) as client:
            try:
                name = await served_model(client, "http://vllm.fuzz:8000")
                assert isinstance(name, str) and name and "\n" not in name
            except (httpx.HTTPError, ValueError) as e:
                assert "\n" not in str(e) and str(e)
            n = await max_model_len(client, "http://vllm.fuzz:8000", "m")
            assert n is None or (isinstance(n, int) and 0 < n < 2**53)
            got = await tokenize_corpus(client, "http://vllm.fuzz:8000", "m", 1)
            if got is not None:
                assert all(isinstance(t, int) and 0 <= t < 2**53 for t in got[0]) and got[0]
            v = await fetch_version(client, "http://vllm.fuzz:8000", 5.0)
            assert v is None or (isinstance(v, str) and "\n" not in v)

    asyncio.run(ask())


# --- a run directory someone edited (report, advise --run, calibrate --run) ----------------

_RUN_FILES = ("spec.json", "summary.json", "requests.jsonl", "timeline.jsonl", "events.jsonl")
_RUN_DIR: list[Path] = []


def _jsonl_doc(path: Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_doc(path: Path, doc: Any) -> None:
    if path.suffix == ".json":
        path.write_text(json.dumps(doc))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in doc))


def check_run_dir(rng: random.Random, tmp: Path) -> None:
    """A real run directory with one to three fields of its files given any value: the
    report renders, `advise --run` advises and `calibrate --run` reads figures, or each says
    why in one line (CliError, SizingError, ValueError); never a traceback."""
    import shutil

    from kvwatch.advise.calibrate import figures_from_run
    from kvwatch.common.cli_kit import CliError
    from kvwatch.loadgen.results.run_files import read_run
    from kvwatch.loadgen.results.run_observed import observed_from_dir
    from kvwatch.report.run_page import render_report
    from kvwatch.sizing.advice import advise
    from kvwatch.sizing.errors import SizingError

    if not _RUN_DIR:
        from tests.report.test_run_page import _run_dir

        _RUN_DIR.append(_run_dir(tmp / "fuzz-run-base"))
    run = tmp / "fuzz-run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(_RUN_DIR[0], run)
    for _ in range(rng.randint(1, 3)):
        path = run / rng.choice(_RUN_FILES)
        doc = _jsonl_doc(path)
        places = _places(doc)
        if not places:
            continue
        _spoil(doc, places, rng, 1)
        try:
            _write_doc(path, doc)
        except ValueError:
            continue  # a value JSON cannot hold (nan is written; this is past that)
    for step in ("report", "advise", "calibrate"):
        try:
            if step == "report":
                assert "<html" in render_report(read_run(run))
            elif step == "advise":
                advise(observed_from_dir(run)[0])
            else:
                figures, _, skipped = figures_from_run(run, 8192, 256)
                assert all(math.isfinite(f.value) and f.value >= 0 for f in figures)
        except (CliError, SizingError, ValueError) as e:
            assert str(e) and "\n" not in str(e), (step, e)


# --- a search directory someone edited (kvwatch report on a loadgen search) ---------------

_SEARCH_DOC: list[dict[str, Any]] = []


def check_search_file(rng: random.Random, tmp: Path) -> None:
    """`kvwatch report` on a search directory whose search.json has one to three fields given
    any value: the capacity page, or one CliError line; never a traceback."""
    from kvwatch.common.cli_kit import CliError
    from kvwatch.loadgen.results.search_file import SEARCH_FILE
    from kvwatch.report.capacity_page import render_capacity

    if not _SEARCH_DOC:
        from tests.loadgen.test_search import search_fixture

        _SEARCH_DOC.append(search_fixture())
    doc = json.loads(json.dumps(_SEARCH_DOC[0]))
    places = _places(doc)
    _spoil(doc, places, rng, rng.randint(1, 3))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        (tmp / SEARCH_FILE).write_text(json.dumps(doc))
    except ValueError:
        return  # a value JSON cannot hold
    try:
        page = render_capacity(tmp)
    except CliError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert page.startswith("<!DOCTYPE html>")


# --- vLLM's KV event batches (sidecar --kv-events) ------------------------------------------


def _kv_batch_doc(rng: random.Random) -> Any:
    """A batch as vLLM encodes one: stores that chain, removals, now and then a reset."""
    events: list[Any] = []
    for _ in range(rng.randint(0, 6)):
        kind = rng.choice(["BlockStored"] * 4 + ["BlockRemoved", "AllBlocksCleared"])
        medium = rng.choice(["GPU", "GPU", "GPU", "CPU", None])  # CPU: a KV offloading tier
        hashes = [
            rng.choice([rng.randrange(64), rng.randbytes(8)]) for _ in range(rng.randint(1, 4))
        ]
        if kind == "BlockStored":
            events.append({"type": kind, "block_hashes": hashes, "token_ids": [1] * 16,
                           "parent_block_hash": rng.choice([None, rng.randrange(64)]),
                           "block_size": 16, "lora_id": None, "medium": medium, "lora_name": None,
                           "group_idx": rng.choice([None, 0, 1])})  # fmt: skip
        elif kind == "BlockRemoved":
            events.append({"type": kind, "block_hashes": hashes, "medium": medium})
        else:
            events.append({"type": kind})
    return [1.7e9 + rng.random(), events, None]


def check_kv_event_batch(rng: random.Random, curve: Any) -> None:
    """`sidecar --kv-events` on a batch with fields given any value, or its bytes cut and
    flipped: typed events that the curve takes, or one WireError line; the curve's figures
    stay shares and sizes."""
    import msgspec

    from kvwatch.sidecar.kvevents.wire import WireError, decode_batch, decode_fields

    doc = _kv_batch_doc(rng)
    if rng.random() < 0.5:
        _spoil(doc, _places(doc), rng, rng.randint(1, 3))
    try:
        raw = msgspec.msgpack.encode(doc)
    except (TypeError, OverflowError):
        return
    if rng.random() < 0.3:
        cut = bytearray(raw[: rng.randrange(len(raw) + 1)])
        for _ in range(rng.randint(0, 3)):
            if cut:
                cut[rng.randrange(len(cut))] = rng.randrange(256)
        raw = bytes(cut)
    try:
        batch = decode_batch(raw)
    except WireError as e:
        assert "\n" not in str(e) and str(e)
        return
    # what the typed reader took (msgspec's structs, in C), the field reader takes the same;
    # the one leniency: the typed reader skips fields it does not read without checking their
    # text, where the field reader decodes every string
    try:
        fields = decode_fields(raw)
    except WireError as e:
        assert "UTF-8" in str(e), f"the typed reader took what the field reader refused: {e}"
    else:
        assert batch == fields, "the typed reader and the field reader disagree"
    curve.feed(batch)
    view = curve.view(rng.choice([None, 1, 40, 4000]))
    for p in view.points:
        assert 0.0 <= p.hit_ratio <= 1.0 and p.blocks >= 1
    assert view.ideal_hit_ratio is None or 0.0 <= view.ideal_hit_ratio <= 1.0
    assert view.working_set_blocks is None or view.working_set_blocks >= 1


def check_kv_recording(rng: random.Random, tmp: Path) -> None:
    """`advise --run` on a run's kv_events.bin with bytes cut, flipped or added: a curve and
    notes of what was left out, or one RecordingError line."""
    import msgspec

    from kvwatch.loadgen.results.kv_events import curve_from_recording
    from kvwatch.sidecar.kvevents.recording import RecordingError, write_frame

    path = tmp / "kv_events.bin"
    with path.open("wb") as f:
        for seq in range(rng.randint(0, 5)):
            write_frame(f, rng.choice([seq, seq, rng.randrange(2**64)]),
                        msgspec.msgpack.encode(_kv_batch_doc(rng)))  # fmt: skip
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(0, 4)):
        what = rng.random()
        if data and what < 0.4:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif what < 0.7:
            del data[rng.randrange(len(data) + 1) :]
        else:
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randint(1, 16))
    path.write_bytes(bytes(data))
    try:
        curve, notes = curve_from_recording(path, rng.choice([1, 40, 8000]))
    except RecordingError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert all("\n" not in n for n in notes)
    if curve is not None:
        assert all(0.0 <= h <= 1.0 for _, h in curve.points) and 0.0 <= curve.ideal <= 1.0
