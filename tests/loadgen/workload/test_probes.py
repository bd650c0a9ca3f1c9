"""Bystander probes and the server's own per-request timings: probes are reported apart from the
load and left out of its figures; vLLM's timings (`--enable-per-request-metrics`) are read from
the last usage chunk as outside input and summarised beside the client's."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import msgspec
import pytest

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.results.summary import render_probes, render_server_timings, summarize_records
from kvwatch.loadgen.send.client import _CHUNK, _take_chunk
from kvwatch.loadgen.workload.lengths import DatasetError
from kvwatch.loadgen.workload.probes import ProbeSpec
from kvwatch.loadgen.workload.spec import WorkloadSpec


def _usage_chunk(metrics: object) -> bytes:
    return json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                       "metrics": metrics}).encode()  # fmt: skip


def _take(metrics: object) -> RequestRecord:
    rec = RequestRecord("r", 0.0)
    _take_chunk(_CHUNK.decode(_usage_chunk(metrics)), rec, 1.0)
    return rec


def test_the_servers_timings_are_read_in_seconds() -> None:
    rec = _take({"time_to_first_token_ms": 85.0, "queue_time_ms": 12.5, "mean_itl_ms": 9.1,
                 "tokens_per_second": 103.2})  # fmt: skip
    assert rec.server_ttft == pytest.approx(0.085) and rec.server_queue_time == pytest.approx(
        0.0125
    )
    assert rec.prompt_tokens == 7 and rec.output_tokens == 3 and rec.ok


@pytest.mark.parametrize(
    "metrics",
    ["fast", [1, 2], {"time_to_first_token_ms": "85"}, {"queue_time_ms": -3.0},
     {"queue_time_ms": True}, None],
)  # fmt: skip
def test_odd_timings_leave_the_record_whole(metrics: object) -> None:
    """A server's odd timings are left out; the request and its usage stand."""
    rec = _take(metrics)
    assert rec.ok and rec.output_tokens == 3
    assert rec.server_queue_time is None and rec.server_ttft is None


def _record(
    i: int, *, probe: bool = False, ttft: float = 0.1, stage: str = "s"
) -> dict[str, object]:
    r = RequestRecord(f"{'probe' if probe else stage}/{i}", 0.0, stage=stage, probe=probe,
                      sent_at=0.0, first_token_at=ttft, finished_at=1.0,
                      token_times=[ttft + k * 0.01 for k in range(5)], prompt_tokens=10,
                      output_tokens=5, server_queue_time=0.02, server_ttft=ttft - 0.05)  # fmt: skip
    return r.to_dict()


def test_probes_are_reported_apart_and_left_out_of_the_load() -> None:
    records = [_record(i, ttft=0.1) for i in range(10)]
    records += [_record(i, probe=True, ttft=0.5, stage=("a" if i < 2 else "s")) for i in range(4)]
    s = summarize_records(records)
    assert s["overall"]["requests"] == 10 and s["overall"]["ttft"]["p99"] == pytest.approx(0.1)
    assert s["stages"]["s"]["requests"] == 10 and "a" not in s["stages"]
    assert s["probes"]["overall"]["requests"] == 4
    assert s["probes"]["stages"]["a"]["requests"] == 2
    assert s["probes"]["overall"]["ttft"]["p50"] == pytest.approx(0.5)
    text = render_probes(s)
    assert text is not None and "probes a" in text and "probes s" in text
    assert render_probes(summarize_records(records[:10])) is None


def test_server_timings_beside_the_clients() -> None:
    s = summarize_records([_record(i, ttft=0.1 + i / 100) for i in range(10)])
    t = s["overall"]["server_timings"]
    assert t["requests"] == 10
    assert t["queue_time"]["p50"] == pytest.approx(0.02)
    # the client's TTFT = vLLM's queue + its TTFT + what lies outside the engine (30 ms here)
    assert t["client_overhead"]["p50"] == pytest.approx(0.03)
    text = render_server_timings(s)
    assert (
        text is not None and "load: vLLM queue 20/20" in text and "outside the engine 30/30" in text
    )
    plain = RequestRecord("x", 0.0, stage="s", sent_at=0.0, first_token_at=0.1, finished_at=1.0,
                          token_times=[0.1], output_tokens=1)  # fmt: skip
    assert "server_timings" not in summarize_records([plain.to_dict()])["overall"]
    assert render_server_timings(summarize_records([plain.to_dict()])) is None


def test_probe_prompts_are_their_own_and_leave_the_load_unchanged() -> None:
    tokens = tuple(range(5, 3005))
    plain = WorkloadSpec(input_len="100", output_len="20", seed=3, tokens=tokens)
    probed = WorkloadSpec(input_len="100", output_len="20", seed=3, tokens=tokens,
                          probes=ProbeSpec(2.0, 32, 8))  # fmt: skip
    assert list(itertools.islice(plain.items(), 20)) == list(itertools.islice(probed.items(), 20))
    assert plain.probe_stream() is None
    stream = probed.probe_stream()
    assert stream is not None
    probes = list(itertools.islice(stream[1], 20))
    assert {len(p.token_ids or ()) for p in probes} == {32} and {p.max_tokens for p in probes} == {
        8
    }
    load_starts = {it.token_ids[:16] for it in itertools.islice(plain.items(), 200) if it.token_ids}
    assert not any(p.token_ids and p.token_ids[:16] in load_starts for p in probes)
    chat = WorkloadSpec(seed=3, probes=ProbeSpec(1.0, 32, 8)).probe_stream()
    assert chat is not None and next(chat[1]).text  # no /tokenize: words, reversed alike
    assert probed.describe()["probes"] == {"rate": 2.0, "input_tokens": 32, "output_tokens": 8}


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_probe_rate_is_refused(rate: float) -> None:
    with pytest.raises(DatasetError, match="--probe-rate"):
        ProbeSpec(rate)
    with pytest.raises(DatasetError, match="at least 1"):
        ProbeSpec(1.0, 0, 8)


def test_bad_probe_flags_fail_before_any_request(tmp_path: object) -> None:
    """Exit 2 with one line, before the target is even asked (nothing listens on port 9)."""
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", "http://127.0.0.1:9",
         "--rate", "1", "--duration", "1", "--probe-rate", "0", "--run-dir", f"{tmp_path}/r"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    said = out.stderr.strip().splitlines()[-1]  # argparse's usage, then its one-line error
    assert said.startswith("kvwatch loadgen run: error:") and "--probe-rate" in said
    assert "Traceback" not in out.stderr


def test_decoder_refuses_nothing_for_metrics() -> None:
    """`metrics` is kept raw: a value of any JSON type decodes with the chunk."""
    for m in (1, "x", [], {}, None, True):
        assert _CHUNK.decode(_usage_chunk(m)).usage is not None
    with pytest.raises(msgspec.DecodeError):
        _CHUNK.decode(b'{"metrics": ')


def test_the_timeline_thread_hands_the_gil_over_often_while_it_runs() -> None:
    """A /metrics body parsed in the sampler thread must not hold the sender back for the
    interpreter's default 5 ms (docs/loadgen.md, Trace replay: Timing)."""
    from kvwatch.loadgen.results.server_metrics import TimelineRecorder

    before = sys.getswitchinterval()
    with TimelineRecorder("http://127.0.0.1:9", period_s=0.05):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == before
