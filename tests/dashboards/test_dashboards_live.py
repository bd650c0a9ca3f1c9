"""Every panel of every dashboard returns data from a real Prometheus that scraped the real vLLM
fixture and a sidecar through a load that goes from healthy into thrashing, once with the
spelling Prometheus stores on its own and once with the other one (`vllm:` vs `vllm_`), with
kvwatch's rules loaded (the fleet row draws their recordings).

The offload panels are the exception: vLLM's CPU backend cannot offload, so they must be empty
on the fixture (as their descriptions say) and full from a fake server that serves the body
composed from vLLM 0.33's source, its counters rising scrape by scrape. The prefix-cache panels
need minutes of prompt traffic that reuses prefixes before the sidecar has a reference, and the
load's steady demand 50 arrivals a minute: they are filled by a sidecar with short windows
watching a fake server whose cache serves most prompt tokens, its arrivals busy. The router
panels are checked where a router runs (tests/fleet/test_fleet_live.py)."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from kvwatch.alerts.build import render_rules
from kvwatch.dashboards.build import (
    DASHBOARDS,
    KV_EVENT_PANELS,
    LOAD_PANELS,
    OFFLOAD_PANELS,
    PREFIX_PANELS,
    ROUTER_PANELS,
    build,
)
from kvwatch.local.server import LocalVLLM
from tests.burst import THRASH_LOADGEN
from tests.dashboards.live import (
    annotation_queries,
    fill_variables,
    panel_queries,
    run_query,
    substitute,
)
from tests.dashboards.preview import spans_from, write_preview
from tests.http_server import ExpositionHandler, serving
from tests.loadgen.test_loadgen_live import run as loadgen_run
from tests.prometheus import running_prometheus, wait_for_series
from tests.sidecar.running import running_sidecar

pytestmark = pytest.mark.integration

STEP = 1.0
RATE_INTERVAL = "5s"  # what Grafana makes $__rate_interval of a 1 s scrape interval
KV = '{__name__=~"vllm[:_](kv_cache_usage_perc|gpu_cache_usage_perc)"}'
# Where the panel plots go; set it to docs/dashboards to refresh the pictures in the docs.
PREVIEW_DIR = Path(os.environ.get("KVWATCH_DASHBOARD_PREVIEW", "test-artifacts/dashboards"))


def _stored_spelling(prom: str) -> str:
    (s,) = wait_for_series(prom, KV)
    return "vllm:" if s["metric"]["__name__"].startswith("vllm:") else "vllm_"


def test_every_panel_returns_data_in_both_spellings(vllm_server: LocalVLLM, tmp_path: Path) -> None:
    base = vllm_server.base_url
    with running_sidecar(["--target", base, "--interval", "0.5", "--db", ""]) as side:
        targets = {
            "vllm": [base.removeprefix("http://")],
            "kvwatch": [side.removeprefix("http://")],
        }
        # the rules too: the fleet row draws their recordings (a fleet of one engine here)
        rules = render_rules()
        with running_prometheus(targets, rules=rules) as prom_a:
            native = _stored_spelling(prom_a)
            other = "vllm_" if native == "vllm:" else "vllm:"
            rename = (f"{native[:-1]}{native[-1]}(.*)", f"{other}$1")
            with running_prometheus(targets, rename=rename, rules=rules) as prom_b:
                assert _stored_spelling(prom_b) == other
                wait_for_series(prom_b, 'up{job="kvwatch"} == 1')
                start = time.time()
                loadgen_run(
                    base, tmp_path / "load", "--sidecar", side,
                    "--stage", "concurrency:n=2#6", "--stage", "concurrency:n=32#32",
                    *THRASH_LOADGEN, "--seed", "13",
                )  # fmt: skip
                time.sleep(6)  # the last scrapes and rule windows after the load
                end = time.time()
                problems = []
                for prom, spelling in ((prom_a, native), (prom_b, other)):
                    problems += _check_all(prom, spelling, start, end, write=prom is prom_a)
    assert not problems, "\n".join(problems)


_COMPOSED = Path(__file__).resolve().parents[1] / "data" / "vllm-0.33-metrics-offload-composed.txt"
_RISING = re.compile(
    r"^(vllm:(kv_offload_(load|store|total)_bytes|kv_offload_allocation_failure)_total"
    r"\{.*\} )(\S+)$",
    re.M,
)


class _RisingServer(ExpositionHandler):
    """FAKE vLLM /metrics: the composed 0.33 body with the counters `rising` matches raised
    scrape by scrape (`step` says by how much); shared by the fakes below."""

    rising: re.Pattern[str]
    scrapes = 0

    def step(self, m: re.Match[str]) -> float:
        raise NotImplementedError

    def exposition(self) -> str:
        cls = type(self)
        cls.scrapes += 1
        n = cls.scrapes
        return self.rising.sub(
            lambda m: f"{m[1]}{float(m[m.re.groups]) + n * self.step(m)}", _COMPOSED.read_text()
        )


class FakeOffloadingServer(_RisingServer):
    """Offload counters 1 MiB (failures 1) higher at every scrape. Stands in only for what no
    server here can do: offload KV."""

    rising = _RISING

    def step(self, m: re.Match[str]) -> float:
        return 1 if m[2] == "kv_offload_allocation_failure" else 2**20


def test_offload_panels_fill_from_a_server_that_offloads() -> None:
    with serving(FakeOffloadingServer) as fake:
        targets = {"vllm": [fake.removeprefix("http://")]}
        with running_prometheus(targets) as prom_a:
            rename = ("vllm:(.*)", "vllm_$1")
            with running_prometheus(targets, rename=rename) as prom_b:
                start = time.time()
                wait_for_series(prom_b, KV)
                time.sleep(8)  # rates need a few scrapes
                end = time.time()
                problems = []
                for prom, spelling in ((prom_a, "vllm:"), (prom_b, "vllm_")):
                    problems += _check_all(prom, spelling, start, end, write=False,
                                           only=OFFLOAD_PANELS)  # fmt: skip
    assert not problems, "\n".join(problems)


_SOURCES = re.compile(
    r'^(vllm:(prompt_tokens_by_source_total\{.*source="(local_compute|local_cache_hit)"|'
    r"(prompt|generation)_tokens_total\{.*)\} )(\S+)$",
    re.M,
)


class FakeReusingServer(_RisingServer):
    """Prompt tokens rising 1,000 a scrape, 900 of them from the prefix cache, and 500 tokens
    generated. Stands in for minutes of conversations on a real server, and for a load busy
    enough that its steady demand is no noise (50 arrivals a minute)."""

    rising = _SOURCES

    def step(self, m: re.Match[str]) -> float:
        return {"local_cache_hit": 900, "local_compute": 100}.get(
            m[3], 1000 if m[4] == "prompt" else 500
        )


def test_prefix_cache_panels_fill_from_a_sidecar_that_has_a_reference() -> None:
    fast = ["--threshold", "short_window_s=1", "--threshold", "long_window_s=2"]
    with (
        serving(FakeReusingServer) as fake,
        running_sidecar(["--target", fake, "--interval", "0.2", *fast]) as side,
    ):
        targets = {"vllm": [fake.removeprefix("http://")],
                   "kvwatch": [side.removeprefix("http://")]}  # fmt: skip
        with running_prometheus(targets) as prom:
            start = time.time()
            wait_for_series(prom, "kvwatch_prompt_cache_hit_ratio_reference")
            wait_for_series(prom, "kvwatch_kv_steady_demand_blocks")  # 10 s of arrivals
            time.sleep(6)  # a few of Prometheus's scrapes
            end = time.time()
            problems = _check_all(prom, "vllm:", start, end, write=False,
                                  only=PREFIX_PANELS + LOAD_PANELS)  # fmt: skip
    assert not problems, "\n".join(problems)


def _check_all(
    prom: str,
    spelling: str,
    start: float,
    end: float,
    write: bool,
    only: tuple[str, ...] | None = None,
) -> list[str]:
    """Problems with the panels; `only` names the panels to check, else all but the offload
    ones, which must then be empty (the fixture's CPU backend has no offloading)."""
    problems = []
    with httpx.Client(timeout=10) as client:
        for name in sorted(DASHBOARDS):
            doc = build(name)
            values = fill_variables(client, prom, doc, start, end)

            def query(expr: str, instant: bool, values: dict[str, str] = values) -> list:
                e = substitute(expr, values, end - start, RATE_INTERVAL)
                return run_query(client, prom, e, start, end, instant, STEP)

            results: dict[str, list] = {}
            for pq in panel_queries(doc):
                if only is not None and pq.panel not in only:
                    continue
                series = query(pq.expr, pq.instant)
                finite = [v for s in series for _, v in s.points if math.isfinite(v)]
                if only is None and pq.panel in PREFIX_PANELS + LOAD_PANELS:
                    continue  # test_prefix_cache_panels_fill_from_a_sidecar_that_has_a_reference
                if only is None and pq.panel in KV_EVENT_PANELS:
                    continue  # need --kv-events: tests/sidecar/test_kv_events_live.py
                if only is None and pq.panel in ROUTER_PANELS:
                    continue  # no router here: tests/fleet/test_fleet_live.py fills them
                if only is None and pq.panel in OFFLOAD_PANELS:
                    if finite:
                        problems.append(f"{spelling} {name}: {pq.panel} has data on CPU vLLM")
                elif not finite:
                    problems.append(f"{spelling} {name}: {pq.panel} {pq.ref} empty: {pq.expr}")
                results.setdefault(pq.panel, []).append((pq, series))
            if only is not None:
                continue
            spans = []
            for title, expr in annotation_queries(doc).items():
                series = query(expr, False)
                if not series:
                    problems.append(f"{spelling} {name}: annotation {title!r} empty: {expr}")
                if "Thrashing" in title:
                    spans = spans_from(series, STEP, "thrashing")
            if write:
                write_preview(PREVIEW_DIR, doc, results, spans, (start, end))
    return problems
