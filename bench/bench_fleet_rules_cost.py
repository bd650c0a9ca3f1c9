"""What kvwatch's rules and fleet dashboard cost Prometheus at 100 and 1,000 replicas.

A FAKE exporter (this file; no real part can be 1,000 vLLM servers on demand) serves, on one
endpoint, the series kvwatch's rules read for N replicas of one model: vLLM's (KV usage,
running, waiting, preemptions, finished requests, prompt tokens, the request-length histograms'
sum and count, the preemption histogram) and each replica's sidecar's (target up, engine alive,
KV capacity), each series labelled with its replica's `instance` (scraped with honor_labels).
Counters rise and usage moves on every scrape, so rates are real. A real Prometheus scrapes it
every 5 s and evaluates the generated rules every 5 s; after a warm-up its own figures are read
back: each rule group's evaluation time (`/api/v1/rules`), and for each panel of the fleet
dashboard its query's time and samples (`stats=all`).

Then promtool: the generated unit tests of the three fleet judgements at N replicas
(tests/alerts/fleet_scale.py: one replica piled, all short, one killed; 12 minutes of series each)
must pass, and their wall time is recorded (promtool evaluates every rule each minute of them).

    PYTHONPATH=. .venv/bin/python bench/bench_fleet_rules_cost.py --replicas 100 1000 \\
        [--save bench/results/fleet-rules-cost.json]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvwatch.alerts.build import render_rules
from kvwatch.dashboards.build import build
from kvwatch.fleet.services import running_service
from tests.alerts.fleet_scale import scale_tests
from tests.dashboards.live import panel_queries, substitute
from tests.http_server import ExpositionHandler, serving

_MODEL = "m"
_BUCKETS = ("0", "1", "2", "+Inf")


def exposition(replicas: int, t: float) -> str:
    """The series of `replicas` replicas at time t (seconds)."""
    out: list[str] = []
    for i in range(replicas):
        inst = f'instance="r{i}:8000"'
        lab = f'{inst},model_name="{_MODEL}",engine="0"'
        n = t * (1 + i % 7)  # each replica its own pace
        usage = 0.5 + 0.45 * math.sin(t / 60 + i)
        out += [
            f"vllm:kv_cache_usage_perc{{{lab}}} {usage:.4f}",
            f"vllm:num_requests_running{{{lab}}} {10 + i % 20}",
            f"vllm:num_requests_waiting{{{lab}}} {i % 3}",
            f"vllm:num_preemptions_total{{{lab}}} {int(n / 50) if i % 10 == 0 else 0}",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {int(n)}',
            f"vllm:prompt_tokens_total{{{lab}}} {int(n * 1000)}",
            f"vllm:request_prompt_tokens_sum{{{lab}}} {int(n * 1000)}",
            f"vllm:request_prompt_tokens_count{{{lab}}} {int(n)}",
            f"vllm:request_generation_tokens_sum{{{lab}}} {int(n * 200)}",
            f"vllm:request_generation_tokens_count{{{lab}}} {int(n)}",
            *(f'vllm:request_preemptions_bucket{{{lab},le="{b}"}} {int(n)}' for b in _BUCKETS),
            f"vllm:request_preemptions_count{{{lab}}} {int(n)}",
            f"vllm:request_preemptions_sum{{{lab}}} 0",
        ]
        side = f'instance="r{i}:9477",target="http://127.0.0.1:8000"'
        out += [
            f"kvwatch_target_up{{{side}}} 1",
            f"kvwatch_engine_alive{{{side}}} 1",
            f'kvwatch_kv_cache_capacity_tokens{{{side},model_name="{_MODEL}",engine="0"}} 1310720',
            f'kvwatch_kv_cache_free_tokens{{{side},model_name="{_MODEL}",engine="0"}} '
            f"{int(1310720 * (1 - usage))}",
            f'kvwatch_state_level{{{side},model_name="{_MODEL}",engine="0"}} 0',
        ]
    return "\n".join(out) + "\n"


def _exporter(replicas: int) -> type[ExpositionHandler]:
    t0 = time.time()

    class FleetExporter(ExpositionHandler):
        def exposition(self) -> str:
            return exposition(replicas, time.time() - t0)

    return FleetExporter


def _panel_queries() -> list[tuple[str, str]]:
    """Every fleet-dashboard query as Grafana would send it: all models, a 1m rate window."""
    return [
        (pq.panel, substitute(pq.expr, {"model_name": ".*"}, 3600, "1m"))
        for pq in panel_queries(build("kvwatch-fleet.json"))
    ]


def measure(replicas: int, warmup_s: float) -> dict[str, Any]:
    with serving(_exporter(replicas)) as exporter:
        return _measure(replicas, warmup_s, exporter.removeprefix("http://"))


def _measure(replicas: int, warmup_s: float, exporter: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-rulecost-"))  # running_service removes it
    (tmp / "rules.yaml").write_text(render_rules())
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
        f"rule_files: [{str(tmp / 'rules.yaml')!r}]\n"
        "scrape_configs:\n  - job_name: fleet\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: [{exporter!r}]\n"
    )
    with running_service("prometheus", tmp, lambda port: [
            "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        ]) as prom:  # fmt: skip
        time.sleep(warmup_s)
        groups = httpx.get(prom + "/api/v1/rules", timeout=30).json()["data"]["groups"]
        rules = {
            g["name"]: {
                "evaluation_s": g["evaluationTime"],
                "slowest": sorted(
                    ((r.get("name"), r["evaluationTime"]) for r in g["rules"]),
                    key=lambda x: -x[1],
                )[:3],
            }
            for g in groups
        }
        series = httpx.get(prom + "/api/v1/query", params={"query": "count({__name__=~'.+'})"},
                           timeout=30).json()["data"]["result"][0]["value"][1]  # fmt: skip
        panels = []
        for title, expr in _panel_queries():
            r = httpx.get(prom + "/api/v1/query", params={"query": expr, "stats": "all"},
                          timeout=60).json()  # fmt: skip
            stats = r.get("data", {}).get("stats", {})
            panels.append({
                "panel": title,
                "eval_s": stats.get("timings", {}).get("evalTotalTime"),
                "samples": stats.get("samples", {}).get("totalQueryableSamples"),
                "error": r.get("error"),
            })  # fmt: skip
    total = sum(g["evaluation_s"] for g in rules.values())
    return {"replicas": replicas, "series": int(series), "rule_groups": rules,
            "rules_evaluation_s": total, "panels": panels}  # fmt: skip


def measure_promtool(replicas: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-promtool-"))
    (tmp / "rules.yaml").write_text(render_rules())
    doc = scale_tests(replicas, tmp / "rules.yaml")
    (tmp / "test.yaml").write_text(yaml.safe_dump(doc, width=10000))
    t0 = time.monotonic()
    p = subprocess.run(["promtool", "test", "rules", str(tmp / "test.yaml")],
                       capture_output=True, text=True)  # fmt: skip
    wall = time.monotonic() - t0
    shutil.rmtree(tmp)
    if p.returncode != 0:
        raise SystemExit(f"promtool failed at {replicas} replicas:\n{p.stdout[-3000:]}{p.stderr}")
    series = sum(len(t["input_series"]) for t in doc["tests"])
    return {"tests": len(doc["tests"]), "input_series": series, "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--replicas", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--warmup", type=float, default=75.0, help="seconds before reading (75)")
    ap.add_argument("--save", type=Path)
    ns = ap.parse_args()
    results = [measure(n, ns.warmup) | {"promtool": measure_promtool(n)} for n in ns.replicas]
    for r in results:
        worst = max(r["panels"], key=lambda p: p["eval_s"] or 0)
        rules_ms = r["rules_evaluation_s"] * 1000
        print(f"{r['replicas']:>5} replicas, {r['series']:,} series: rules {rules_ms:.1f} ms "
              f"per evaluation; slowest panel {worst['panel']!r} {worst['eval_s'] * 1000:.1f} "
              f"ms, {worst['samples']:,} samples; promtool's {r['promtool']['tests']} fleet "
              f"tests passed in {r['promtool']['wall_s']} s")  # fmt: skip
    if ns.save:
        ns.save.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
