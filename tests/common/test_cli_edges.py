"""Edges the CLI fuzzer (tests/cli_fuzzing.py) found, each pinned by a line that failed before
its fix: a traceback, a wrong exit code, or a run that looked fine against no server at all."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.cli_fuzzing import DEAD_URL, Outcome, check, run_cli
from tests.http_server import serving


def _refused(argv: list[str], code: int = 2, says: str = "") -> Outcome:
    o = run_cli(argv)
    check(o)
    assert o.code == code, (o.code, o.stderr[-600:])
    assert says in o.stderr.splitlines()[-1], o.stderr[-600:]
    return o


class _RefusesEverything(BaseHTTPRequestHandler):
    """A FAKE server that answers every request with 503: vLLM will not do so on cue."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(503)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


def test_a_run_with_a_named_model_still_needs_a_server(tmp_path: Path) -> None:
    # before: --model skipped the only reachability check; 0 of 3 done, exit 0
    _refused(["loadgen", "run", "--url", DEAD_URL, "--model", "m", "--rate", "1",
              "--requests", "3", "--run-dir", str(tmp_path / "r"), "--no-progress"],
             3, "cannot reach")  # fmt: skip


def test_a_search_stops_when_no_request_is_answered(tmp_path: Path) -> None:
    # before: 14 probes over 6 minutes, then "compute binds first" from a server that was not there
    with serving(_RefusesEverything) as url:
        _refused(["loadgen", "search", "--url", url, "--model", "m", "--slo", "ttft=500ms",
                  "--probe-requests", "2", "--run-dir", str(tmp_path / "s"), "--no-progress"],
                 3, "every request failed")  # fmt: skip
    assert (tmp_path / "s" / "search.json").is_file()  # what it measured is kept


@pytest.mark.parametrize(
    "argv, says",
    [
        (["loadgen", "serve-local", "--port", "70000"], "--port"),
        (["loadgen", "serve-local", "--port", "-1"], "--port"),
        (["twin", "--model", "llama-3.1-8b", "--gpu", "h100", "--port", "9" * 25], "--port"),
    ],
)
def test_ports_outside_0_to_65535_are_refused(argv: list[str], says: str) -> None:
    _refused(argv, 2, says)  # before: OverflowError from bind()


def test_every_numeric_flag_is_checked_where_it_enters() -> None:
    """A bare int or float lets nan, inf, 0 and negatives through to the work: every number
    goes through one of kvwatch.common.cli_kit's kinds (number_in and the names built on it)."""
    import argparse

    from kvwatch.cli import build_parser
    from tests.cli_fuzzing import _walk

    bare = [
        f"{' '.join(words)} {a.option_strings[-1]}"
        for words, parser in _walk(build_parser(), ())
        for a in parser._actions
        if isinstance(a, argparse.Action) and a.type in (int, float)
    ]
    assert not bare, bare


# Lines the fuzzer found raising instead of refusing (each failed before its fix). {tmp} is a
# fresh folder, {file} a file in it.
FOUND = [
    (["loadgen", "run", "--url", DEAD_URL, "--trace", "{trace}",
      "--trace-speed", "1e-320"], 2, "trace speed"),  # ValueError from the replay
    (["loadgen", "run", "--url", DEAD_URL, "--sweep", "concurrency=1,-inf", "--requests", "1"],
     2, "sweep values"),  # OverflowError
    (["loadgen", "run", "--url", DEAD_URL, "--rate", "1", "--requests", "1", "--run-dir",
      "a" * 300], 2, "run directory"),  # OSError: name too long
    (["loadgen", "run", "--url", DEAD_URL, "--rate", "1", "--requests", "1",
      "--input-len", "nan"], 2, "--input-len"),  # was exit 3 "cannot reach", hiding the mistake
    (["loadgen", "run", "--url", DEAD_URL, "--rate", "1", "--requests", "1",
      "--input-len", "1e300"], 2, "at most 10,000,000"),  # built a 10^300-token prompt
    (["loadgen", "run", "--url", DEAD_URL, "--sessions", "--rate", "1", "--requests", "1",
      "--think-time", "1e300"], 2, "at most"),  # a session that never ended
    (["loadgen", "run", "--url", DEAD_URL, "--rate", "1", "--requests", "1",
      "--priorities", "99999999999999999999:1"], 2, "fit 64 bits"),  # 400s, then a lost run
    (["loadgen", "serve-local", "--model", "a" * 300], 3, "model directory"),
    (["loadgen", "serve-local", "--model", "{tmp}", "--log", "{tmp}"], 2, "server log"),
    (["loadgen", "build-model", "--cache-dir", "{file}"], 2, "build the model"),
    (["twin", "--model", "llama-3.1-8b", "--gpu", "h100", "--log", "{tmp}"], 2, "server log"),
    (["calibrate", "--run", "{tmp}", "--model", "a" * 300, "--gpu", "h100"], 2, ""),
    (["demo", "--run-dir", "{file}"], 2, "run directory"),
    (["demo", "--fleet", "2", "--run-dir", "{file}"], 2, "run directory"),
    (["fleet", "--work-dir", "{file}"], 2, "fleet's folder"),
    (["sidecar", "--target", DEAD_URL, "--webhook-config", "{html}"], 2, "not YAML/JSON"),
    (["sidecar", "--target", DEAD_URL, "--db", "a" * 300], 2, "File name too long"),
    (["dashboards", "--out", "{nl}"], 2, "a\\nb"),  # the message was two lines
]  # fmt: skip


@pytest.mark.parametrize(("argv", "code", "says"), FOUND, ids=lambda v: str(v)[:40])
def test_what_the_fuzzer_found_is_refused_in_one_line(
    argv: list[str], code: int, says: str, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "a\nb").write_text("a file where a folder is wanted, with a newline in its name")
    (tmp_path / "page.html").write_text("<html>\nh1{font-size:22px;margin: 0}\n</html>\n")
    trace = Path(__file__).resolve().parents[1] / "data" / "traces"
    fill = {"{tmp}": str(tmp_path), "{file}": str(tmp_path / "file"),
            "{html}": str(tmp_path / "page.html"), "{nl}": str(tmp_path / "a\nb"),
            "{trace}": str(trace / "mooncake-conversation-first120.jsonl")}  # fmt: skip
    (tmp_path / "cwd").mkdir()
    o = run_cli([fill.get(a, a) for a in argv], cwd=tmp_path / "cwd")  # fills whole words
    check(o)
    assert o.code == code, (o.code, o.stderr[-600:])
    assert says in o.stderr.splitlines()[-1], o.stderr[-600:]


@pytest.mark.parametrize("source", ["--prometheus", "--sidecar"])
def test_advise_reads_a_trickling_server_within_one_deadline(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: httpx's timeout bounds each read, so a server sending a byte every 0.2 s held
    `advise` as long as it liked (a FAKE server: no real one trickles on demand)."""
    import json
    import time

    from kvwatch.advise import sources
    from kvwatch.common import promql
    from tests.sidecar.fakes import raw_http_server

    monkeypatch.setattr(promql, "READ_DEADLINE_S", 1.0)
    monkeypatch.setattr(sources, "SIDECAR_DEADLINE_S", 1.0)
    body = json.dumps({"status": "success", "data": {"result": []}, "pad": "x" * 200}).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with raw_http_server(reply, trickle_s=0.2) as url:
        t0 = time.monotonic()
        o = run_cli(["advise", source, url])
        took = time.monotonic() - t0
    check(o)
    assert o.code == 3 and "within 1 s" in o.stderr, o.stderr
    assert took < 5, took


def test_more_replicas_than_memory_holds_are_refused_before_any_start() -> None:
    # before: all 50 started at once and the machine ran out of memory
    o = run_cli(["fleet", "--replicas", "1000"])
    check(o)
    assert o.code == 2 and "--replicas 1000 needs about" in o.stderr, o.stderr


def test_a_lognormal_tail_is_cut_where_lengths_end() -> None:
    """lognormal:100,1000 drew past any float: OverflowError, or a prompt of 10^300 tokens."""
    import random

    from kvwatch.loadgen.workload.lengths import MAX_LENGTH, parse_length

    d = parse_length("lognormal:100,1000")
    draws = [d.sample(random.Random(i)) for i in range(50)]
    assert max(draws) == MAX_LENGTH and min(draws) >= 1


def test_advice_refuses_figures_no_server_reports() -> None:
    """A Prometheus answering 1e308 (the bench's fuzzing found it): int(inf) in the bytes
    needed, an OverflowError, where a hand-edited run or a hostile source should be one line."""
    from kvwatch.sizing.advice import Observed, advise
    from kvwatch.sizing.errors import SizingError

    obs = Observed(capacity_blocks=4000, block_size=16, kv_bytes_per_token=131072.0,
                   peak_demand=1e308, seq_len_p95=900, seq_len_max=900, preemptions=0,
                   source="prometheus http://p:9090")  # fmt: skip
    with pytest.raises(SizingError, match="peak_demand 1e.308 is no figure a server reports"):
        advise(obs)


@pytest.mark.integration
def test_the_demo_on_a_target_it_cannot_reach_exits_3(tmp_path: Path) -> None:
    """Before: exit 2 (bad usage) with the load generator's whole error nested in its own."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--target", DEAD_URL, "--run-dir",
         str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 3, p.stderr[-800:]
    assert (
        said == f"kvwatch: error: the load generator failed: cannot reach {DEAD_URL}: "
        "All connection attempts failed"
    ), said


def test_a_record_parquet_cannot_hold_loses_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an int past 64 bits in a record (a priority of 2^64) crashed the Parquet write,
    and summary.json, written after it, was never written: the run was lost."""
    from kvwatch.loadgen.results.rundir import read_records, write_run

    recs = [{"ok": False, "priority": 2**64, "error": "HTTP 400"}, {"ok": True, "priority": 1}]
    write_run(tmp_path / "run", {"stages": []}, recs, [], {"overall": {"requests": 2}})
    assert (tmp_path / "run" / "summary.json").is_file()
    assert read_records(tmp_path / "run") == recs
    assert not (tmp_path / "run" / "requests.parquet").exists()
    assert "requests.parquet not written" in capsys.readouterr().err
