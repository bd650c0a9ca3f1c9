"""Panels and layout of kvwatch's Grafana dashboards, built with grafana-foundation-sdk.

Queries come from dashboards/queries.py and threshold lines from sidecar/contract/thresholds.py, so
a panel's orange line sits where the sidecar starts to say "pressure". `kvwatch dashboards` writes
the JSON; a test fails when the checked-in files differ from what this renders.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from kvwatch.dashboards import queries as q
from kvwatch.dashboards.files import DASHBOARD_FILES
from kvwatch.sidecar.contract import catalogue as cat
from kvwatch.sidecar.contract.thresholds import DEFAULT_THRESHOLDS, Thresholds
from kvwatch.sidecar.contract.vocabulary import E2E, GENERATION_TOKENS, ITL, PROMPT_TOKENS, TTFT

__all__ = [
    "DASHBOARDS", "OFFLOAD_PANELS", "PREFIX_PANELS", "KV_EVENT_PANELS", "ROUTER_PANELS",
    "kv_pressure", "fleet",
    "build", "render", "write_all",
]  # fmt: skip

# Panels that only a server with --kv-offloading-size fills (vLLM's CPU backend cannot offload,
# so the live test checks them against the body composed from 0.33's source)
OFFLOAD_PANELS = ("KV offload traffic", "KV offload tier full")
# the sidecar's reference needs minutes of prompt traffic that reuses prefixes
PREFIX_PANELS = ("Prefix cache hit share and its reference", "Prompt tokens computed again")
# filled only where a sidecar follows vLLM's KV events (--kv-events)
KV_EVENT_PANELS = (
    "Prefix cache hit rate by cache size",
    "Prefix cache hit rate with room for everything",
    "Replicas' prefix caches: copies, as routed, pooled",
)
# the load's steady demand needs 50 admissions in a minute before it says anything
LOAD_PANELS = ("What the load holds when it levels vs the cache",)
# vllm-router's own view; filled where Prometheus scrapes the router (tests/fleet)
ROUTER_PANELS = ("Router: requests sent per replica", "Router: replicas it can send to")
_NO_OFFLOAD = (
    " Empty on servers without --kv-offloading-size (vLLM's CPU backend cannot offload) and "
    "on releases without the offloading connector's metrics."
)

_DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
_STATE_COLORS = ("green", "yellow", "orange", "red")


def _query(expr: str, legend: str, ref: str, instant: bool = False) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(_DS)
    return t.instant() if instant else t.range()


class _HasTargets(Protocol):
    def with_target(self, target: prometheus.Dataquery) -> Self: ...


_P = TypeVar("_P", bound=_HasTargets)


def _targets(panel: _P, *queries: tuple[str, str]) -> _P:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _steps(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def _kv_lines(th: Thresholds) -> dashboard.ThresholdsConfig:
    """KV usage's lines: the sidecar's pressure and saturation thresholds."""
    return _steps((None, "green"), (th.pressure_kv, "orange"), (th.saturated_kv, "red"))


def _legend() -> common.VizLegendOptions:
    return (
        common.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )


def _series(
    title: str,
    description: str,
    unit: str,
    *queries: tuple[str, str],
    width: int = 12,
    lines: dashboard.ThresholdsConfig | None = None,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(_DS)
        .span(width)
        .height(8)
        .line_width(1)
        .fill_opacity(10)
        .legend(_legend())
    )
    if lines is not None:
        p = p.thresholds(lines).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE)
        )
    return _targets(p, *queries)


def _state_mappings() -> list[dm.ValueMap | dm.RangeMap | dm.RegexMap | dm.SpecialValueMap]:
    return [
        dm.ValueMap(
            options={
                str(i): dm.ValueMappingResult(text=name, color=color, index=i)
                for i, (name, color) in enumerate(zip(cat.STATES, _STATE_COLORS, strict=True))
            }
        )
    ]


def _state_timeline(title: str, description: str, expr: str, legend: str) -> Any:
    p = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .unit("none")
        .datasource(_DS)
        .span(24)
        .height(6)
        .mappings(_state_mappings())
        .thresholds(_steps((None, "green"), (1, "yellow"), (2, "orange"), (3, "red")))
        .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
    )
    return _targets(p, (expr, legend))


def _bars(title: str, description: str, unit: str, expr: str, legend: str, **kw: Any) -> Any:
    p = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(_DS)
        .span(kw.get("width", 8))
        .height(8)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if "lines" in kw:
        p = p.thresholds(kw["lines"])
    if "mappings" in kw:
        p = p.mappings(kw["mappings"])
    return p.with_target(
        _query(expr, legend, "A", instant=True).format(
            kw.get("fmt", pm.PromQueryFormat.TIME_SERIES)
        )
    )


def _variables(d: dashboard.Dashboard, with_instance: bool = True) -> dashboard.Dashboard:
    d = d.with_variable(
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    )
    chain = [("model_name", "Model", "")]
    if with_instance:
        chain += [
            ("instance", "Instance", 'model_name=~"$model_name"'),
            ("engine", "Engine", 'model_name=~"$model_name", instance=~"$instance"'),
        ]
    for name, label, matchers in chain:
        d = d.with_variable(
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(_DS)
            .query(q.label_values(name, matchers))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return d


def _annotations(d: dashboard.Dashboard, matchers: str = q.SIDECAR_FILTER) -> dashboard.Dashboard:
    thrash = q.state_level(matchers) + f" >= {len(cat.STATES) - 1}"
    return d.annotation(
        dashboard.AnnotationQuery()
        .name("Thrashing (kvwatch)")
        .datasource(_DS)
        .enable(True)
        .icon_color("red")
        .expr(thrash)
    ).annotation(
        dashboard.AnnotationQuery()
        .name("Load stages (kvwatch loadgen)")
        .datasource(_DS)
        .enable(True)
        .icon_color("blue")
        .expr(f"max by (stage) ({cat.LOAD_STAGE.series})")
    )


def _layout(d: dashboard.Dashboard, *rows: tuple[str | None, list[Any]]) -> dashboard.Dashboard:
    """Adds rows and panels in order with ids 1, 2, ... (Grafana wants them unique)."""
    n = 0
    for title, panels in rows:
        if title is not None:
            n += 1
            d = d.with_row(dashboard.Row(title).id(n))
        for panel in panels:
            n += 1
            d = d.with_panel(panel.id(n))
    return d


def _kv_cache_row(th: Thresholds) -> list[Any]:
    """Usage against the thresholds, capacity, demand and the exhaustion forecast."""
    kv_lines = _kv_lines(th)
    kv = (
        _series(
            "KV cache usage",
            "Fraction of KV cache blocks in use per engine. Orange: the sidecar's pressure "
            f"threshold ({th.pressure_kv:.0%}); red: full ({th.saturated_kv:.0%}). A full "
            "cache alone is fine; full plus preemptions is thrashing.",
            "percentunit",
            (q.kv_usage(), "{{instance}} {{model_name}} e{{engine}}"),
            lines=kv_lines,
        )
        .min(0)
        .max(1)
    )
    capacity = _targets(
        stat.Panel()
        .title("KV cache capacity")
        .description(
            "Blocks and tokens the KV cache holds (from vLLM's cache_config_info or its "
            "startup log, as the sidecar read them). Tokens = blocks x block size."
        )
        .unit("short")
        .datasource(_DS)
        .span(12)
        .height(8)
        .color_mode(cm.BigValueColorMode.NONE)
        .graph_mode(cm.BigValueGraphMode.NONE),
        (f"max by (model_name, engine) ({q.sidecar(cat.KV_CACHE_CAPACITY_BLOCKS)})",
         "blocks {{model_name}} e{{engine}}"),
        (f"max by (model_name, engine) ({q.sidecar(cat.KV_CACHE_CAPACITY_TOKENS)})",
         "tokens {{model_name}} e{{engine}}"),
    )  # fmt: skip
    demand = _series(
        "New blocks per step vs free blocks",
        "Each running request needs a new block every block_size tokens, so the batch asks "
        "for running / block_size blocks per step. When the free blocks meet that line, the "
        "next steps preempt.",
        "short",
        (q.sidecar(cat.BLOCK_DEMAND_PER_STEP), "demand {{model_name}} e{{engine}}"),
        (q.sidecar(cat.KV_CACHE_FREE_BLOCKS), "free {{model_name}} e{{engine}}"),
    )
    exhaustion = _series(
        "Time until the free blocks run out",
        "The sidecar's forecast: the time until the band KV usage's peaks move in (a line "
        "fitted over the last minute, lifted by 1.5 x the spread around it) reaches 100%. "
        "0: the peaks already reach full. Empty while usage is not rising (a steady load, "
        "however busy). KvwatchKvExhaustionImminent fires under "
        f"{th.exhaustion_warn_s:g} s.",
        "s",
        (q.sidecar(cat.SECONDS_TO_KV_EXHAUSTION), "{{model_name}} e{{engine}}"),
    )
    steady = _series(
        "What the load holds when it levels vs the cache",
        "The load's own view, by Little's law: admissions per second x how long a request "
        "holds its blocks x the blocks it holds, against the cache's blocks. Above the "
        "cache: this load does not fit when it levels, whatever the usage says now. Empty "
        "until a request has finished and under 50 arrivals a minute (the rate would be "
        "noise).",
        "short",
        (q.sidecar(cat.KV_STEADY_DEMAND_BLOCKS), "demand {{model_name}} e{{engine}}"),
        (q.sidecar(cat.KV_CACHE_CAPACITY_BLOCKS), "cache {{model_name}} e{{engine}}"),
    )
    return [kv, capacity, demand, exhaustion, steady]


def _preemption_row(th: Thresholds) -> list[Any]:
    """The judgement, preemptions, the work redone and the queue."""
    preempt = _series(
        "Preemptions per second",
        "vLLM preemptions (vllm:num_preemptions_total); the counter rises when the victim "
        "next produces output. The red line is the sidecar's thrashing rate "
        f"({th.thrashing_preemptions_per_s}/s sustained). Under --scheduling-policy priority, "
        "the share the sidecar judged the policy at work (lower-priority requests giving way: "
        "reported, not paged) is drawn apart.",
        "short",
        (q.preemption_rate(), "{{instance}} {{model_name}} e{{engine}}"),
        (
            q.sidecar(cat.POLICY_PREEMPTIONS_PER_SECOND),
            "priority policy {{model_name}} e{{engine}}",
        ),
        lines=_steps((None, "green"), (th.thrashing_preemptions_per_s, "red")),
    ).axis_label("preemptions/s")
    state = _state_timeline(
        "kvwatch state",
        "The sidecar's judgement per engine: ok, pressure (KV above "
        f"{th.pressure_kv:.0%}), saturated (full and requests waiting), thrashing (a steady "
        "stream of preemptions with evidence that work is redone).",
        q.state_level(),
        "{{model_name}} e{{engine}}",
    )
    per_request = _bars(
        "Preemptions per finished request",
        "How many times each request finished in the dashboard's range was preempted "
        "(vllm:request_num_preemptions, 0.30+). Requests preempted more than once are "
        "the thrashing victims: their users saw the longest stalls.",
        "short",
        q.preemptions_per_request(),
        "{{le}}",
        fmt=pm.PromQueryFormat.HEATMAP,
        width=8,
    )
    episodes = _targets(
        stat.Panel()
        .title("Thrashing episodes")
        .description(
            "Thrashing episodes the sidecar opened in the dashboard's range (kept across "
            "sidecar restarts, in its SQLite store)."
        )
        .unit("short")
        .datasource(_DS)
        .span(4)
        .height(8)
        .thresholds(_steps((None, "green"), (1, "red")))
        .graph_mode(cm.BigValueGraphMode.NONE),
        (
            "sum by (model_name, engine) (increase("
            f"{q.sidecar(cat.THRASHING_EPISODES)}[$__range]))",
            "{{model_name}} e{{engine}}",
        ),
    )
    recomputed = _series(
        "Work redone",
        "Tokens the sidecar estimates were recomputed in the current thrashing episode "
        "(each preemption throws away the victim's context), and requests preempted more "
        "than once in the long window.",
        "short",
        (q.sidecar(cat.EPISODE_RECOMPUTED_TOKENS), "tokens {{model_name}} e{{engine}}"),
        (q.sidecar(cat.REPEAT_PREEMPTED_REQUESTS), "repeat victims {{model_name}}"),
    )
    queue = _series(
        "Running and waiting requests",
        "The running batch and the queue. Preempted requests go back to the queue; vLLM "
        "0.20+ shows them under reason=capacity.",
        "short",
        (q.running(), "running {{instance}} e{{engine}}"),
        (q.waiting(), "waiting {{instance}} e{{engine}}"),
        (q.waiting_by_reason(), "waiting ({{reason}}) {{instance}} e{{engine}}"),
    )
    stalls = _series(
        "Stall seconds by cause",
        "Seconds per second that streams spent stalled (gaps over 5x the median gap and 0.25 s "
        "in vLLM's inter-token latency histogram), by what the server did in each scrape "
        "window: preemption (victims and the streams behind their recompute), prefill "
        "(prompts batched beside the decodes: the prompt budget's levers, `kvwatch advise`), "
        "other (nothing on the server says: the queue, the host, the client). 2 means two "
        "streams stalled at all times.",
        "short",
        (q.stall_seconds_rate(), "{{cause}} {{model_name}} e{{engine}}"),
    ).axis_label("stalled streams")
    return [state, preempt, recomputed, per_request, episodes, queue, stalls]


def _sources_row() -> list[Any]:
    """Where prompt KV came from, requests refused at the queue limits, the CPU tier."""
    sources = _series(
        "Prompt tokens by source",
        "Where prompt KV came from, tokens per second: computed (prefill), the prefix cache, "
        "or a KV connector (vllm:prompt_tokens_by_source). Cache hits are prompts the cache "
        "did not have to hold twice. Empty on releases before the family (seen on 0.32).",
        "short",
        (q.prompt_tokens_by_source(), "{{source}} {{instance}} e{{engine}}"),
        width=8,
    ).axis_label("tokens/s")
    refused = _series(
        "Requests refused at the queue limit",
        "Requests vLLM refused at --max-num-queued-reqs or --max-num-queued-tokens, per "
        "second (vllm:admission_rejections, per model: it has no engine label). Refusals keep "
        "the queue short, so a full cache that refuses is saturated though little waits. "
        "Zero without those flags; empty on releases before the family (seen on 0.32).",
        "reqps",
        (q.admission_rejections(), "{{reason}} {{instance}}"),
        width=8,
    )
    offload = _series(
        OFFLOAD_PANELS[0],
        "Bytes per second between the KV cache and its CPU offload tier: stored (evicted or "
        "preempted blocks going out) and loaded (coming back instead of being recomputed)."
        + _NO_OFFLOAD,
        "Bps",
        (q.offload_bytes("store"), "stored {{instance}} e{{engine}}"),
        (q.offload_bytes("load"), "loaded {{instance}} e{{engine}}"),
        width=4,
    )
    offload_full = _series(
        OFFLOAD_PANELS[1],
        "Offload stores that found no room in the CPU tier (vllm:kv_offload_allocation_failure):"
        " the tier is too small for what the GPU cache evicts; raise --kv-offloading-size."
        + _NO_OFFLOAD,
        "short",
        (q.offload_failures(), "{{instance}} e{{engine}}"),
        width=4,
    )
    return [sources, refused, offload, offload_full]


def _prefix_cache_row(th: Thresholds) -> list[Any]:
    """The second kind of thrashing: a prefix cache losing the prefixes its traffic reuses."""
    share = _series(
        PREFIX_PANELS[0],
        "Share of prompt tokens the cache served over the sidecar's short window, and the share "
        f"its windows reached over the last {th.prefix_reference_window_s:g} s (their 90th "
        "percentile): what it hits with room. A share down to "
        f"{1 - th.prefix_hit_drop:.0%} of the reference for {th.prefix_for_s:g} s is "
        "KvwatchPrefixCacheThrashing: prefixes evicted before they are reused.",
        "percentunit",
        (q.sidecar_gauge(cat.PROMPT_CACHE_HIT_RATIO), "now {{target}} e{{engine}}"),
        (q.sidecar_gauge(cat.PROMPT_CACHE_HIT_REFERENCE), "reference {{target}} e{{engine}}"),
        width=8,
    )
    recomputed = _series(
        PREFIX_PANELS[1],
        "Prompt tokens per second the cache served at its reference share and computes again "
        "now: prompt tokens/s x (reference - current share). GPU time spent on prefill that "
        "was already done.",
        "short",
        (q.sidecar_gauge(cat.PROMPT_TOKENS_RECOMPUTED_PER_SECOND), "{{target}} e{{engine}}"),
        width=8,
    ).axis_label("tokens/s")
    losing = _series(
        "Prefix cache thrashing",
        "1 while the sidecar judges the prefix cache losing reusable prefixes "
        "(KvwatchPrefixCacheThrashing's condition, before its `for`), else 0.",
        "short",
        (q.sidecar_gauge(cat.PREFIX_CACHE_THRASHING), "{{target}} e{{engine}}"),
        width=8,
    )
    curve = _bars(
        KV_EVENT_PANELS[0],
        "The prefix-cache hit rate this traffic would get at other cache sizes, from vLLM's "
        "KV events (kvwatch sidecar --kv-events): an LRU miss-ratio curve. 1x is the server's "
        "own size; the gain from 2x is what more KV memory buys in prompt tokens not computed "
        "(kvwatch advise --sidecar prices it). Empty without --kv-events.",
        "percentunit",
        q.sidecar_curve(cat.PREFIX_CACHE_HIT_RATIO_AT_SIZE),
        "{{factor}}: {{blocks}} blocks, {{target}} e{{engine}}",
        width=12,
    )
    ideal = _series(
        KV_EVENT_PANELS[1],
        "The hit rate with room for every block the traffic read (the curve's ceiling), and "
        "the smallest cache that reaches 99% of it: the working set of the prefixes it reuses. "
        "Blocks stored again after vLLM removed them are prefix-cache thrash, counted exactly. "
        "Empty without --kv-events.",
        "percentunit",
        (q.sidecar_gauge(cat.PREFIX_CACHE_IDEAL_HIT_RATIO), "ideal {{target}} e{{engine}}"),
        width=12,
    )
    return [share, recomputed, losing, curve, ideal]


def _latency(title: str, family: Any, what: str) -> timeseries.Panel:
    return _series(
        title,
        f"{what} percentiles from vLLM's histogram over $__rate_interval windows.",
        "s",
        *[(q.latency_quantile(family, x), f"p{x * 100:g} " + "{{instance}}") for x in q.QUANTILES],
        width=8,
    )


def _load_row() -> list[Any]:
    """Tokens per second and the latency percentiles users feel."""
    tokens = _series(
        "Token throughput",
        "Generated and prefilled tokens per second. Thrashing shows as prefill that goes "
        "up while generation goes down: the same prompts computed again.",
        "short",
        (q.token_rate(GENERATION_TOKENS), "generated {{instance}} e{{engine}}"),
        (q.token_rate(PROMPT_TOKENS), "prefilled {{instance}} e{{engine}}"),
    ).axis_label("tokens/s")
    return [
        tokens.span(24),
        _latency("Time to first token", TTFT, "Time to first token"),
        _latency("Inter-token latency", ITL, "Inter-token latency"),
        _latency("End-to-end latency", E2E, "End-to-end request latency"),
    ]


def kv_pressure(th: Thresholds = DEFAULT_THRESHOLDS) -> dashboard.Dashboard:
    d = (
        dashboard.Dashboard("kvwatch / KV pressure")
        .uid("kvwatch-kv-pressure")
        .description(
            "KV cache pressure, preemption and thrashing for vLLM servers, with kvwatch's "
            "judgement. Built by kvwatch from its metric vocabulary."
        )
        .tags(["kvwatch", "vllm"])
        .refresh("10s")
        .time("now-1h", "now")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .timezone("browser")
    )
    return _layout(
        _annotations(_variables(d)),
        ("KV cache", _kv_cache_row(th)),
        ("Preemption and thrashing", _preemption_row(th)),
        ("Prompt sources, refusals and offload", _sources_row()),
        ("Prefix cache", _prefix_cache_row(th)),
        ("Load and latency", _load_row()),
    )


def fleet(th: Thresholds = DEFAULT_THRESHOLDS) -> dashboard.Dashboard:
    every = 'model_name=~"$model_name"'
    kv_lines = _kv_lines(th)
    where = "{{instance}} {{model_name}} e{{engine}}"
    d = (
        dashboard.Dashboard("kvwatch / Fleet")
        .uid("kvwatch-fleet")
        .description("Many vLLM instances at once, worst offenders first. Built by kvwatch.")
        .tags(["kvwatch", "vllm"])
        .refresh("30s")
        .time("now-3h", "now")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .timezone("browser")
    )
    panels = [
        _bars(
            "Engines by kvwatch state",
            "How many engines the sidecars judge ok, under pressure, saturated or thrashing.",
            "short",
            f"sum by (state) ({cat.STATE.select(every)})",
            "{{state}}",
        ),
        _bars(
            "Highest KV usage",
            "The ten engines with the fullest KV cache now.",
            "percentunit",
            f"topk(10, {q.kv_usage(every)})",
            where,
            lines=kv_lines,
        )
        .min(0)
        .max(1),
        _bars(
            "Most preemptions per second",
            "The ten engines preempting most over the last rate window. Above "
            f"{th.thrashing_preemptions_per_s}/s sustained the sidecar calls it thrashing.",
            "short",
            f"topk(10, {q.preemption_rate(every)})",
            where,
            lines=_steps((None, "green"), (th.thrashing_preemptions_per_s, "red")),
        ),
        _state_timeline(
            "kvwatch state per engine",
            "Each engine's state over time: ok, pressure, saturated, thrashing.",
            f"max by (target, model_name, engine) ({cat.STATE_LEVEL.select(every)})",
            "{{target}} {{model_name}} e{{engine}}",
        ),
        _series(
            "KV cache usage, all engines",
            "Every engine's KV usage; the orange and red lines are the sidecar's thresholds.",
            "percentunit",
            (q.kv_usage(every), where),
            lines=kv_lines,
        )
        .min(0)
        .max(1),
        _series(
            "Waiting requests, all engines",
            "Queues that grow while KV is full mean the cache, not the GPU, is the limit.",
            "short",
            (q.waiting(every), where),
        ),
    ]
    return _layout(
        _annotations(_variables(d, with_instance=False), every),
        (None, panels),
        ("Fleet: imbalance or shortage, per model", _fleet_row(th)),
    )


def _fleet_row(th: Thresholds) -> list[Any]:
    """The fleet recordings (alerts/fleet.py): which engines ran out, who has room, where the
    router sends the work, and how many engines the measured demand asks for."""
    every = f'{cat.FLEET_BY}=~"$model_name"'
    model = "{{" + cat.FLEET_BY + "}}"
    engine = "{{instance}} e{{engine}}"

    def rec(r: cat.Recording) -> str:
        return f"{r.name}{{{every}}}"

    return [
        _series(
            "Engines out of KV, with room, in all",
            "Per model: engines that ran out of KV blocks in the last minute, engines below "
            f"{th.pressure_kv:.0%} that did not, and all. Out of KV while others have room is "
            "imbalance (the routing); out of KV with none left with room is a shortage (more "
            "replicas or KV memory).",
            "short",
            (rec(cat.REC_FLEET_SHORT), f"{model} out of KV"),
            (rec(cat.REC_FLEET_ROOM), f"{model} with room"),
            (rec(cat.REC_FLEET_REPLICAS), f"{model} engines"),
            width=8,
        ),
        _series(
            "KV usage spread between engines",
            "Per model: the fullest and the emptiest engine's KV usage. A wide spread with the "
            "fullest at the top is the router piling work on one engine.",
            "percentunit",
            (rec(cat.REC_FLEET_KV_MAX), f"{model} fullest"),
            (rec(cat.REC_FLEET_KV_MIN), f"{model} emptiest"),
            width=8,
            lines=_kv_lines(th),
        )
        .min(0)
        .max(1),
        _series(
            "Engines needed against engines up",
            "Per model: engines of the fleet's mean KV size that hold the demand measured now "
            f"below {th.pressure_kv:.0%} (what the KEDA ScaledObject scales to), against those "
            "reporting, and those down or dead.",
            "short",
            (rec(cat.REC_FLEET_REPLICAS_NEEDED), f"{model} needed"),
            (rec(cat.REC_FLEET_REPLICAS), f"{model} up"),
            (rec(cat.REC_FLEET_DOWN), f"{model} down or dead"),
            width=8,
        ),
        _series(
            "Share of requests, per engine",
            "Each engine's share of its model's finished requests over 5 minutes.",
            "percentunit",
            (f"{cat.REC_REQUEST_SHARE.name}{{{every}}}", engine),
            width=8,
        ),
        _series(
            "Share of prompt tokens, per engine",
            "Each engine's share of its model's prompt tokens over 5 minutes: above its share "
            "of requests, it gets the long contexts (long sessions).",
            "percentunit",
            (f"{cat.REC_PROMPT_TOKEN_SHARE.name}{{{every}}}", engine),
            width=8,
        ),
        _series(
            "KV demand against capacity",
            "Per model: KV tokens the requests hold and wait for, against the live engines' "
            "capacity and the capacity lost to engines down or dead.",
            "short",
            (rec(cat.REC_FLEET_DEMAND), f"{model} demand"),
            (rec(cat.REC_FLEET_CAPACITY), f"{model} capacity"),
            (rec(cat.REC_FLEET_CAPACITY_LOST), f"{model} lost"),
            width=8,
        ),
        _series(
            ROUTER_PANELS[0],
            "vllm-router's own count of the requests its policy sent to each replica, per "
            "second. Against the engines' shares above: the router's choice, and whether a "
            "replica's long sessions come from it. Needs Prometheus to scrape the router.",
            "reqps",
            (
                f"sum by (worker, policy) (rate({cat.ROUTER_DECISIONS}[$__rate_interval]))",
                "{{worker}} {{policy}}",
            ),
            width=12,
        ),
        _series(
            ROUTER_PANELS[1],
            "1 while the router's health check passes for a replica, 0 once it fails (it "
            "stops sending there): a replica down for the router is capacity lost for the fleet.",
            "short",
            (f"max by (worker) ({cat.ROUTER_WORKER_HEALTH})", "{{worker}}"),
            width=12,
        )
        .min(0)
        .max(1),
        _series(
            KV_EVENT_PANELS[2],
            "From the replicas' KV events (one sidecar following each: --kv-events): the share "
            "of their cached blocks that copies a block another replica holds, their hit rate "
            "as routed, and the hit rate of one cache of their memory together (what a "
            "prefix-aware router nears). A wide gap is hits the routing leaves on the table: "
            "kvwatch advise --sidecar names the router policy. Empty without --kv-events.",
            "percentunit",
            (cat.FLEET_PREFIX_DUPLICATED_RATIO.select(every), "copies " + model),
            (cat.FLEET_PREFIX_REPLICAS_HIT_RATIO.select(every), "as routed " + model),
            (cat.FLEET_PREFIX_POOLED_HIT_RATIO.select(every), "pooled " + model),
            width=24,
        )
        .min(0)
        .max(1),
    ]


DASHBOARDS: dict[str, Callable[[Thresholds], dashboard.Dashboard]] = dict(
    zip(DASHBOARD_FILES, (kv_pressure, fleet), strict=True)
)


_INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def _to_grafana_11(doc: dict[str, Any]) -> dict[str, Any]:
    """Two fixes to the SDK's output so it fits Grafana's published 11.6 types: a Prometheus
    annotation's query goes in `target` (the SDK writes the legacy top-level `expr`), and the
    interval-variable fields the SDK writes on every variable are dropped from the others."""
    for a in doc.get("annotations", {}).get("list", []):
        if "expr" in a:
            a["target"] = {"expr": a.pop("expr"), "refId": "Anno"}
    for v in doc.get("templating", {}).get("list", []):
        if v.get("type") != "interval":
            for key in _INTERVAL_ONLY:
                v.pop(key, None)
    return doc


def build(name: str, th: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (plain dicts)."""
    doc = json.loads(json.dumps(DASHBOARDS[name](th).build(), cls=JSONEncoder))
    return _to_grafana_11(doc)


def render(name: str, th: Thresholds = DEFAULT_THRESHOLDS) -> str:
    """Stable JSON (sorted keys, fixed indent), so regeneration gives clean diffs."""
    return json.dumps(build(name, th), sort_keys=True, indent=2) + "\n"


def write_all(out: Path, th: Thresholds = DEFAULT_THRESHOLDS) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in DASHBOARDS:
        path = out / name
        path.write_text(render(name, th))
        written.append(path)
    return written
