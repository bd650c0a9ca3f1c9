"""Where `kvwatch calibrate` reads a live server: its `/metrics` watched now, a sidecar's
readings of it (the sidecar has watched already), or its Prometheus history. Each gives, per
engine, the slices `timing/server_slices.py` turns into figures.

`/metrics` is read with the sidecar's own parser (every value checked where it enters), every
`interval` seconds for `watch` seconds or until Ctrl-C, which ends the watch early and keeps
what was read. A twin says its time scale on `/metrics`; its gaps are then divided by it, so
the figures are in the twin's simulated seconds, and the calibration says so. Prometheus is
asked, per slice of its history, each counter's `increase()` and the mean of the running and
waiting gauges (the requests held: a closed loop's streams, queued ones included).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError
from kvwatch.common.promql import prometheus_range, series_by_labels
from kvwatch.sidecar.contract.vocabulary import (
    GENERATION_TOKENS,
    ITERATION_TOKENS,
    ITL,
    PREEMPTIONS,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PROMPT_TOKENS,
    RUNNING,
    TTFT,
    WAITING,
    Family,
    promql_selector,
)
from kvwatch.sizing.errors import SizingError
from kvwatch.timing.server_slices import Reading, Slice, slices_from_readings

__all__ = ["Watched", "watch", "watch_metrics", "slices_from_prometheus", "from_sidecar"]

SCRAPE_TIMEOUT_S = 5.0


@dataclass
class Watched:
    """What a watch of `/metrics` read: per engine its readings; kept as it goes, so an
    interrupted watch still has what it read."""

    readings: dict[str, list[Reading]] = field(default_factory=dict)
    scale: float = 1.0
    failed_scrapes: int = 0
    scrapes: int = 0


async def watch_metrics(
    url: str,
    watch_s: float,
    interval_s: float,
    into: Watched,
    progress: Callable[[str], None] = lambda _: None,
) -> None:
    """Scrape `url` every `interval_s` for `watch_s` seconds into `into`. The first scrape
    must succeed (CliError, exit 3); later failures are counted and the watch goes on."""
    from kvwatch.sidecar.metrics.observe import observe
    from kvwatch.sidecar.metrics.scrape import metrics_url, scrape_once

    target = metrics_url(url)
    start = time.monotonic()
    next_note = start + 30.0
    async with httpx.AsyncClient() as client:
        while True:
            t = time.monotonic()
            out = await scrape_once(client, target, SCRAPE_TIMEOUT_S)
            if out.exposition is None:
                if into.scrapes == 0:
                    raise CliError(f"cannot scrape {url}: {out.error}", EXIT_UNREACHABLE)
                into.failed_scrapes += 1
            else:
                if into.scrapes == 0 and out.time_scale:
                    into.scale = out.time_scale
                into.scrapes += 1
                for (model, engine), obs in observe(out.exposition).items():
                    name = f"{model or 'model'} engine {engine or '0'}"
                    # in the figures' clock: a twin's simulated seconds, as its gaps are
                    reading = obs.calibration_reading(t / into.scale, into.scale)
                    into.readings.setdefault(name, []).append(reading)
            now = time.monotonic()
            if now - start >= watch_s:
                return
            if now >= next_note:
                progress(f"watched {now - start:.0f} of {watch_s:.0f} s ({into.scrapes} scrapes)")
                next_note = now + 30.0
            await asyncio.sleep(max(0.0, min(interval_s - (now - t), start + watch_s - now)))


def watch(
    url: str, watch_s: float, interval_s: float, slice_s: float, progress: Callable[[str], None]
) -> tuple[dict[str, list[Slice]], float, list[str]]:
    """Watch `/metrics` (Ctrl-C ends it early, keeping what was read) and cut it in slices."""
    into = Watched()
    notes = []
    try:
        asyncio.run(watch_metrics(url, watch_s, interval_s, into, progress))
    except KeyboardInterrupt:
        notes.append(f"the watch was ended early, after {into.scrapes} scrapes")
    if into.failed_scrapes:
        notes.append(f"{into.failed_scrapes} of the scrapes failed and were left out")
    out: dict[str, list[Slice]] = {}
    for name, readings in into.readings.items():  # slices of `slice_s` wall seconds
        slices, skipped = slices_from_readings(readings, slice_s / into.scale)
        out[name] = slices
        notes += [f"{name}: {s}" for s in skipped]
    return out, into.scale, notes


SIDECAR_DEADLINE_S = 30.0  # for the whole of /api/readings (900 points an engine)


def from_sidecar(
    url: str, slice_s: float, transport: httpx.BaseTransport | None = None
) -> tuple[dict[str, list[Slice]], float, list[str]]:
    """A sidecar's recent readings (`GET /api/readings`), cut in slices: per engine its
    slices, the time scale (1: wall; a twin's K: its simulated seconds), what was left out."""
    from kvwatch.common.http_read import ReadError, get_json
    from kvwatch.sidecar.contract.readings import ReadingsError, readings_from_json

    where = url.rstrip("/") + "/api/readings"
    try:
        with httpx.Client(transport=transport) as client:
            doc = get_json(client, where, deadline_s=SIDECAR_DEADLINE_S).body
    except (ReadError, ValueError) as e:
        raise CliError(f"cannot read {where}: {e}", EXIT_UNREACHABLE) from None
    try:
        per_engine, scales = readings_from_json(doc)
    except ReadingsError as e:
        raise CliError(f"{where}: {e}") from None
    if len(set(scales.values())) > 1:
        raise CliError(f"{where}: its engines run on different clocks; calibrate them apart")
    out: dict[str, list[Slice]] = {}
    notes = []
    for name, readings in per_engine.items():
        out[name], skipped = slices_from_readings(readings, slice_s)
        notes += [f"{name}: {s}" for s in skipped]
    return out, next(iter(scales.values()), 1.0), notes


_BY = "instance, engine"


def slices_from_prometheus(
    base: str,
    window_s: float,
    slice_s: float,
    instance: str | None = None,
    end: float | None = None,
    transport: httpx.BaseTransport | None = None,
) -> tuple[dict[str, list[Slice]], list[str]]:
    """Per (instance, engine) Prometheus scrapes, its slices of the last `window_s` seconds
    (to `end`, unix; now by default): each point of a range query at step `slice_s` is the
    slice ending there. `instance` keeps one instance's engines.

    A counter's growth in a slice is the difference of its values at the slice's two ends
    (the last scrape at or before each), not `increase()`: windows of one step each leave the
    scrape interval between them out, and `increase()` stretches what it saw over it, which
    loses a burst there (vLLM counts a wave's prompt tokens at once) and inflates the slices
    around it (the CPU bench, 4 s slices: a third of the spans read no prompt token). A
    counter that fell (a restart) leaves its slice out."""
    end = time.time() if end is None else end
    start = end - window_s + slice_s
    rng = f"{max(1, round(slice_s))}s"
    match = "" if instance is None else f'instance="{_promql_string(instance)}"'
    notes: list[str] = []

    def series(promql: str, since: float = start) -> dict[tuple[str, str], dict[float, float]]:
        rows = prometheus_range(client, base, promql, since, end, slice_s)
        got = series_by_labels(rows, ("instance", "engine"))
        return {(k[0], k[1]): {t: v for t, v in pts.items() if v >= 0} for k, pts in got.items()}

    def increase(
        fam: Family, suffix: str, matchers: str = match
    ) -> dict[tuple[str, str], dict[float, float | None]]:
        # newest spelling first: a server in a rename writes both, and a sum would count twice
        for wire in fam.wire:
            one = Family(fam.name, fam.kind, (wire,), fam.help, fam.bounds)
            got = series(f"sum by ({_BY}) ({promql_selector(one, matchers, suffix)})",
                         start - slice_s)  # fmt: skip
            if got:
                return {k: _differences(pts, slice_s) for k, pts in got.items()}
        return {}

    with httpx.Client(timeout=30, transport=transport) as client:

        def held_mean(over: str, offset: str = "") -> dict[tuple[str, str], dict[float, float]]:
            """Running + waiting, averaged over `over` (a closed loop's streams, queued ones
            included); a point without the waiting gauge counts it 0."""
            got = [
                series(
                    f"sum by ({_BY}) (avg_over_time({promql_selector(f, match)}[{over}]{offset}))"
                )
                for f in (RUNNING, WAITING)
            ]
            return {k: {t: v + got[1].get(k, {}).get(t, 0.0) for t, v in pts.items()}
                    for k, pts in got[0].items()}  # fmt: skip

        running = held_mean(rng)
        # the fewest running any scrape in the slice saw: a slice that emptied is no busy span
        emptied = series(
            f"sum by ({_BY}) (min_over_time({promql_selector(RUNNING, match)}[{rng}]))"
        )
        half = f"{max(1, round(slice_s / 2))}s"
        first, second = held_mean(half, f" offset {half}"), held_mean(half)
        if not running:
            where = f" for instance {instance!r}" if instance else ""
            raise SizingError(
                f"Prometheus at {base} has no vllm num_requests_running series{where} in the "
                f"last {window_s:.0f} s"
            )
        itl_sum, itl_count = increase(ITL, "sum"), increase(ITL, "count")
        if not itl_count:
            raise SizingError(
                f"Prometheus at {base} has no inter-token latency histogram "
                "(vllm:inter_token_latency_seconds) in the window: nothing to calibrate from"
            )
        p_sum = increase(REQUEST_PROMPT_TOKENS, "sum")
        p_count = increase(REQUEST_PROMPT_TOKENS, "count")
        o_sum = increase(REQUEST_GENERATION_TOKENS, "sum")
        o_count = increase(REQUEST_GENERATION_TOKENS, "count")
        ttft_sum, ttft_count = increase(TTFT, "sum"), increase(TTFT, "count")
        preempt = increase(PREEMPTIONS, "")
        steps = increase(ITERATION_TOKENS, "count")
        generated = increase(GENERATION_TOKENS, "")
        local = 'source="local_compute"' + (f", {match}" if match else "")
        computed = increase(PROMPT_TOKENS_BY_SOURCE, "", local) or increase(PROMPT_TOKENS, "")
    instances = sorted({k[0] for k in running})
    if instance is None and len(instances) > 1:
        raise SizingError(
            f"Prometheus scrapes {len(instances)} vLLM instances ({', '.join(instances[:5])}"
            f"{', ...' if len(instances) > 5 else ''}): name one with --instance (a calibration "
            "is one deployment's)"
        )
    out: dict[str, list[Slice]] = {}
    for key, points in sorted(running.items()):
        name = f"{key[0]} engine {key[1] or '0'}"
        slices = []
        missing = fell = 0
        for t, held in sorted(points.items()):

            def at(
                d: Mapping[tuple[str, str], Mapping[float, float | None]],
                t: float = t,
                key: tuple[str, str] = key,
            ) -> float | None:
                return d.get(key, {}).get(t)

            counters = (itl_sum, itl_count, p_sum, p_count, o_sum, o_count, ttft_sum,
                        ttft_count, preempt, steps, generated, computed)  # fmt: skip
            if any(t in d.get(key, {}) and d[key][t] is None for d in counters):
                fell += 1
                continue
            itl, gaps = at(itl_sum), at(itl_count)
            if itl is None or gaps is None:
                missing += 1
                continue
            slices.append(
                Slice(
                    start=t - slice_s, end=t, held=held, itl_sum=itl, itl_count=gaps,
                    prompt_sum=at(p_sum) or 0.0, prompt_count=at(p_count) or 0.0,
                    output_sum=at(o_sum) or 0.0, output_count=at(o_count) or 0.0,
                    preemptions=at(preempt) or 0.0, ttft_sum=at(ttft_sum) or 0.0,
                    ttft_count=at(ttft_count) or 0.0, held_first=at(first),
                    held_second=at(second), steps=at(steps) or 0.0,
                    prompt_computed=at(computed) or 0.0, generated=at(generated) or 0.0,
                    empty_share=0.0 if (at(emptied) or 0.0) >= 1 else None,
                )
            )  # fmt: skip
        if missing:
            notes.append(f"{name}: {missing} slice(s) without inter-token latency in the history")
        if fell:
            notes.append(f"{name}: {fell} slice(s): a counter fell (the server restarted)")
        out[name] = slices
    return out, notes


def _differences(points: dict[float, float], step_s: float) -> dict[float, float | None]:
    """Each point's growth since the point one step before it (None: it fell, a restart);
    points without one a step before are left out."""
    out: dict[float, float | None] = {}
    ts = sorted(points)
    for a, b in zip(ts, ts[1:], strict=False):
        if abs(b - a - step_s) <= step_s / 2:
            grew = points[b] - points[a]
            out[b] = grew if grew >= 0 else None
    return out


def _promql_string(text: str) -> str:
    """A label value inside a PromQL double-quoted string."""
    return re.sub(r'(["\\])', r"\\\1", text).replace("\n", "\\n")
