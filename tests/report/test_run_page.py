"""The run report's arithmetic and page, from a run directory written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.loadgen.results.run_files import read_run
from kvwatch.loadgen.results.rundir import write_run
from kvwatch.report.run_page import bucket_delta, counter_rate, render_report, state_spans


def report(run: Path) -> str:
    """The page, as `kvwatch report RUN_DIR` makes it: the directory read once, then drawn."""
    return render_report(read_run(run))


def test_counter_rate_survives_a_restart() -> None:
    points: list[tuple[float, float | None]] = [(0, 10), (1, 14), (2, 3), (3, None)]
    assert counter_rate(points) == [(1, 4.0), (2, 3.0)]  # the drop counts from zero


def test_state_spans() -> None:
    rows: list[tuple[float, str | None]] = list(enumerate(["ok", "thrashing", "thrashing", "ok"]))
    rows.append((4, "thrashing"))
    assert [(s.start, s.end) for s in state_spans(rows)] == [(1, 3), (4, 4)]


def test_bucket_delta_gives_counts_per_bucket() -> None:
    before = ((1.0, 5.0), (2.0, 6.0), (float("inf"), 6.0))
    after = ((1.0, 9.0), (2.0, 12.0), (float("inf"), 13.0))
    assert bucket_delta(before, after) == [("\u2264 1", 4.0), ("\u2264 2", 2.0), ("more", 1.0)]


def _run_dir(tmp: Path) -> Path:
    cache = {"block_size": 32, "num_blocks": 40, "kv_cache_memory_bytes": 40 * 32 * 8192}
    spec = {
        "target": "http://x:8000", "model": "m", "start_unix": 1000.0,
        "stages": [{"name": "s1", "pattern": "Concurrency(n=4)", "label": "4 streams",
                    "duration_s": None, "count": 8, "warmup": False}],
        "workload": {"synthetic": True, "input_len": "30", "output_len": "300",
                     "token_exact": True, "shared_prefix": 0, "prefix_groups": 1},
        "server_before": {"cache": cache, "preemption_buckets": [[1.0, 0.0], [2.0, 0.0]]},
        "server_after": {"cache": cache, "preemption_buckets": [[1.0, 5.0], [2.0, 8.0]]},
    }  # fmt: skip
    records = [
        {"ok": True, "sent_at": i * 0.5, "finished_at": 5 + i, "ttft": 0.2, "e2e": 4.0,
         "max_gap": 1.0 + i, "stalls": i % 3, "prompt_tokens": 30, "output_tokens": 300,
         "expected_input_tokens": 30, "expected_output_tokens": 300}
        for i in range(8)
    ]  # fmt: skip
    events = [{"event": "stage_start", "stage": "s1", "t": 0.1, "unix": 1000.1}]
    summary = {
        "overall": {
            "completed": 8,
            "failed": 0,
            "duration_s": 12.0,
            "ttft": {"p50": 0.2},
            "stalls": 8,
            "requests_with_stalls": 5,
            "stalls_preempting": 6,
        },
        "server": {"preemptions": 12, "repeat_preempted": 3},
    }
    timeline = [
        {"t": 1000.0 + i, "kv_usage": min(1.0, i / 5), "running": 4, "waiting": i % 2,
         "preemptions_total": 2.0 * i, "state": "thrashing" if 5 <= i < 9 else "ok"}
        for i in range(12)
    ]  # fmt: skip
    write_run(tmp, spec, records, events, summary, timeline)
    return tmp


def test_report_has_every_section(tmp_path: Path) -> None:
    html = report(_run_dir(tmp_path / "run"))
    for text in ("1 episode(s)", "KV cache usage", "Preemptions per second",
                 "Running and waiting", "at the time it finished", "Requests by stalls",
                 "Requests by how often vLLM preempted them", "Sizing advice", "The arithmetic",
                 "undersized",
                 "8 in 5 requests; 6 while the server preempted, 2 without"):  # fmt: skip
        assert text in html, text
    assert "<script" not in html and "http-equiv" not in html
    assert html.count("<svg") == 6


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "kvwatch", "report"]
    p = subprocess.run([*run, str(tmp_path / "nope")], capture_output=True, text=True)
    assert p.returncode == 2 and "not a run directory" in p.stderr and "Traceback" not in p.stderr
    bad = _run_dir(tmp_path / "bad")
    (bad / "summary.json").write_text("{")
    p = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert p.returncode == 2 and "unreadable" in p.stderr
    odd = _run_dir(tmp_path / "odd")  # rows someone edited by hand: skipped, not a crash
    with (odd / "timeline.jsonl").open("a") as fh:
        fh.write('{"kv_usage": 0.5}\n[1, 2]\n')
    p = subprocess.run([*run, str(odd)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    (odd / "events.jsonl").write_text("{not json\n")
    p = subprocess.run([*run, str(odd)], capture_output=True, text=True)
    assert p.returncode == 2 and "unreadable" in p.stderr and "Traceback" not in p.stderr
    good = _run_dir(tmp_path / "good")
    p = subprocess.run([*run, str(good)], capture_output=True, text=True)
    assert p.returncode == 0 and json.dumps(str(good / "report.html"))[1:-1] in p.stdout


def test_incidents_the_sidecar_saw_are_listed_escaped(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["sidecar"] = {
        "engines": {"http://x:8000": {"status": "dead", "reason": "the log says: <b>x</b>"}},
        "incidents": [
            {"what": "engine_death", "at": "12-01 10:00:05", "detail": "EngineCore encountered "
             "a fatal error.", "cause": "RuntimeError: <script>alert(1)</script>", "lines": 3},
        ],
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    html = report(run)
    assert "<h2>Incidents</h2>" in html and "engine_death" in html and "12-01 10:00:05" in html
    assert "dead: the log says: &lt;b&gt;x&lt;/b&gt;" in html
    assert "<script" not in html and "&lt;script&gt;" in html
    # without a sidecar, the section says so
    assert "No sidecar was given to this run" in report(_run_dir(tmp_path / "plain"))


def test_the_page_speaks_the_users_words(tmp_path: Path) -> None:
    """Stage keys, the workload's raw JSON and a model's local path were what the page showed."""
    run = _run_dir(tmp_path / "run")
    spec = json.loads((run / "spec.json").read_text())
    spec["model"] = "/root/.cache/kvwatch/models/tiny-llama-30m-v1"
    (run / "spec.json").write_text(json.dumps(spec))
    html = report(run)
    assert (
        "<code title='/root/.cache/kvwatch/models/tiny-llama-30m-v1'>tiny-llama-30m-v1</code>"
        in html
    )
    assert "<td>4 streams</td><td><code class='key'>s1</code>" in html  # the load, then its key
    assert ">4 streams</text>" in html  # the chart marks say the load too
    assert "<th>prompt tokens</th><td>30</td>" in html and "exact (token ids)" in html
    assert '"synthetic"' not in html and "{" not in html.split("<h2>Workload</h2>")[1][:2000]
    spec["model"] = "meta-llama/Llama-3.1-8B-Instruct"  # a hub name is kept whole
    (run / "spec.json").write_text(json.dumps(spec))
    assert "<code>meta-llama/Llama-3.1-8B-Instruct</code>" in report(run)


@pytest.mark.integration
def test_short_stages_label_their_charts_legibly_in_chromium(tmp_path: Path) -> None:
    """The demo's stage lengths and shorter: every stage label drawn, none over another, none
    past its chart's edge, as Chromium lays them out."""
    from tests.browser import open_page

    run = _run_dir(tmp_path / "run")
    spec = json.loads((run / "spec.json").read_text())
    loads = (2, 8, 10, 24, 32, 64)
    spec["stages"] = [
        {"name": f"concurrency:n={n}#{n}", "pattern": f"Concurrency(n={n})",
         "label": f"{n} streams", "duration_s": None, "count": n, "warmup": False}
        for n in loads
    ]  # fmt: skip
    (run / "spec.json").write_text(json.dumps(spec))
    starts = (0.1, 0.6, 1.1, 3.0, 3.4, 10.5)  # stages half a second long, then longer
    events = [{"event": "stage_start", "stage": f"concurrency:n={n}#{n}", "t": t}
              for n, t in zip(loads, starts, strict=True)]  # fmt: skip
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "report.html").write_text(report(run))
    check = open_page(run / "report.html", tmp_path / "report.png")
    assert check.console_errors == [] and check.page_errors == []
    assert check.label_count == 4 * len(loads)  # four charts over time carry the marks
    assert check.label_overlaps == [] and check.labels_outside == []


def _session_run(tmp: Path) -> Path:
    run = _run_dir(tmp)
    summary = json.loads((run / "summary.json").read_text())
    summary["sessions"] = {
        "sessions": 40, "cut": 1,
        "turns": {"0": {"requests": 40, "prompt_tokens_mean": 2000.0, "ttft": {"p50": 0.7}},
                  "1": {"requests": 39, "prompt_tokens_mean": 2400.0, "ttft": {"p50": 3.1}}},
        "working_set": {"peak_blocks": 10520, "peak_tokens": 167960, "sessions_at_peak": 40,
                        "at_s": 50.0, "block_size": 16, "advised_blocks": 11574,
                        "cache_blocks": 8000, "fits": False,
                        "advised_kv_cache_memory_bytes": 24272437248},
    }  # fmt: skip
    summary["trace"] = {
        "path": "t.jsonl", "format": "mooncake", "usable_rows": 12031, "skipped_rows": {"x": 2},
        "replayed": 918, "left_out": 11113, "clipped": 3, "speed": 1.0, "time_scale": 1.0,
        "window_s": [0, 300], "length_scale": 0.05, "block_tokens": 26, "span_s": 297.0,
        "input_tokens": 1, "output_tokens": 1, "shares_prefixes": True, "server_block_size": 16,
        "implied_prefix_hit_rate": 0.195, "measured_prefix_hit_rate": 0.19,
    }  # fmt: skip
    group = {
        "requests": 20,
        "completed": 19,
        "ttft": {"p50": 0.25, "p99": 1.5},
        "itl": {"p50": 0.02},
        "e2e": {"p99": 9.0},
        "stalls": 3,
        "requests_with_stalls": 2,
    }
    summary["classes"] = {"0": group, "1": dict(group, completed=20, stalls=0)}
    summary["probes"] = {"overall": group, "stages": {"main": dict(group, ttft={"p50": 0.42})}}
    summary["overall"]["server_timings"] = {
        "requests": 90,
        "queue_time": {"p50": 0.0125},
        "ttft_after_queue": {"p50": 0.043},
        "client_overhead": {"p50": 0.015, "p99": 0.028},
    }
    spec = json.loads((run / "spec.json").read_text())
    spec["workload"] = {"sessions": True, "turns": "6", "think_time_s": "2", "input_len": "2000",
                        "turn_input_len": "200", "output_len": "200", "fanout": 3,
                        "token_exact": True}  # fmt: skip
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_sessions_and_a_replay_have_their_sections(tmp_path: Path) -> None:
    html = report(_session_run(tmp_path / "run"))
    for text in ("<h2>Sessions</h2>", "40 conversations, 1 cut short by a failed turn",
                 "2,400", "p50 3.1 s", "give it --kv-cache-memory-bytes 24272437248",
                 "<h2>Trace replay</h2>", "918 of 12031 usable mooncake requests",
                 "rows skipped: 2 x", "3 requests clipped", "hit rate 19.0%",
                 "opening tokens", "calls per turn", "turns per session",
                 "<h2>Priority classes</h2>", "<td>0</td><td class='n'>19/20</td>",
                 "3 in 2 requests", "<h2>Bystander probes</h2>", "p50 420 ms",
                 "vLLM&#x27;s queue time", "p50 12 ms", "p99 28 ms"):  # fmt: skip
        assert text in html, text


def test_a_hand_edited_sessions_summary_does_not_break_the_page(tmp_path: Path) -> None:
    run = _session_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["sessions"]["turns"]["1"]["prompt_tokens_mean"] = "many"
    summary["sessions"]["working_set"] = {"peak_blocks": "x"}
    summary["trace"] = {"format": 3}
    (run / "summary.json").write_text(json.dumps(summary))
    html = report(run)
    assert "The working set in summary.json is unreadable" in html
    assert "The replay in summary.json is unreadable" in html


@pytest.mark.integration
def test_the_sessions_page_renders_cleanly_in_chromium(tmp_path: Path) -> None:
    from tests.browser import open_page

    run = _session_run(tmp_path / "run")
    (run / "report.html").write_text(report(run))
    check = open_page(run / "report.html", tmp_path / "report.png")
    assert check.console_errors == [] and check.page_errors == []


_BAD = ["<i>pwn</i>", 3, None, [], {"p50": "<u>pwn"}, {"x": [1]}, -1e308, "nan", True]


def test_any_hand_edited_section_renders_escaped_without_a_traceback(tmp_path: Path) -> None:
    """`kvwatch report` on a hand-edited summary.json gave tracebacks (its sessions, classes,
    probes or trace sections) and put the sessions' text in the page unescaped."""
    import itertools

    run = _session_run(tmp_path / "run")
    good = json.loads((run / "summary.json").read_text())
    paths = [("sessions",), ("sessions", "sessions"), ("sessions", "cut"), ("sessions", "turns"),
             ("sessions", "turns", "0"), ("sessions", "turns", "0", "requests"),
             ("sessions", "turns", "0", "ttft"), ("classes",), ("classes", "0"),
             ("classes", "0", "ttft"), ("classes", "0", "completed"), ("probes",),
             ("probes", "overall"), ("probes", "stages"), ("probes", "stages", "main"),
             ("trace",), ("trace", "replayed"), ("overall", "server_timings")]  # fmt: skip
    for path, bad in itertools.product(paths, _BAD):
        doc = json.loads(json.dumps(good))
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = bad
        (run / "summary.json").write_text(json.dumps(doc))
        html = report(run)
        assert "<i>pwn" not in html and "<u>pwn" not in html, (path, bad)
