"""Errors are records, not crashes (against a fake server, since vLLM will not misbehave on cue)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.loadgen.results.records import RequestRecord
from kvwatch.loadgen.send.client import stream_completion
from kvwatch.loadgen.send.http1 import Http1Pool
from tests.loadgen.fake_openai import fake_openai
from tests.sidecar.fakes import raw_http_server


def _one(base: str, model: str) -> RequestRecord:
    async def go() -> RequestRecord:
        async with Http1Pool(base, read_timeout_s=10) as pool:
            rec = RequestRecord("r", 0.0)
            return await stream_completion(pool, {"model": model, "prompt": "x",
                                                  "max_tokens": 4}, rec)  # fmt: skip

    return asyncio.run(go())


class TestErrorsAreRecords:
    def test_normal_stream(self) -> None:
        with fake_openai() as (base, _):
            r = _one(base, "ok")
        assert r.ok and r.output_tokens == 4 and len(r.token_times) == 4

    @pytest.mark.parametrize(("mode", "why"), [("http500", "HTTP 500"), ("http400", "HTTP 400"),
                                               ("cut", "without [DONE]"),
                                               ("malformed", "malformed SSE")])  # fmt: skip
    def test_faults(self, mode: str, why: str) -> None:
        with fake_openai() as (base, _):
            r = _one(base, mode)
        assert not r.ok and why in str(r.error) and r.finished_at is not None

    def test_connection_refused(self) -> None:
        with raw_http_server(b"") as url:
            pass
        r = _one(url, "ok")
        assert not r.ok and "ConnectError" in str(r.error)


def _kvwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvwatch", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


class TestRunCli:
    def test_failures_are_counted_and_exit_1(self, tmp_path: Path) -> None:
        with fake_openai() as (base, count):
            p = _kvwatch("loadgen", "run", "--url", base, "--model", "cut", "--rate", "20",
                         "--requests", "5", "--duration", "5", "--run-dir", str(tmp_path / "r"),
                         "--no-progress")  # fmt: skip
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr and count[0] == 5
        summary = json.loads((tmp_path / "r" / "summary.json").read_text())
        assert summary["overall"]["failed"] == 5

    def test_bad_dataset_fails_before_any_request(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "a", "max_tokens": 2}\n{oops\n')
        with fake_openai() as (base, count):
            p = _kvwatch("loadgen", "run", "--url", base, "--rate", "5", "--duration", "1",
                         "--dataset", str(bad), "--run-dir", str(tmp_path / "r"))  # fmt: skip
        assert p.returncode == 2 and "bad.jsonl:2: not valid JSON" in p.stderr
        assert count[0] == 0 and "Traceback" not in p.stderr

    @pytest.mark.parametrize("command", ["run", "search"])
    def test_a_run_dir_that_cannot_be_written_fails_before_any_request(
        self, tmp_path: Path, command: str
    ) -> None:
        """Found before the load, not after it (a whole sweep was lost with a traceback)."""
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        load = ["--rate", "5", "--duration", "1"] if command == "run" else ["--slo", "ttft=1s"]
        with fake_openai() as (base, count):
            p = _kvwatch("loadgen", command, "--url", base, *load, "--no-progress",
                         "--run-dir", str(blocker / "run"))  # fmt: skip
        assert p.returncode == 2 and count[0] == 0, p.stderr
        assert p.stderr.strip() == (
            f"kvwatch: error: cannot write the run directory {blocker / 'run'}: Not a directory"
        )

    def test_a_failed_run_leaves_no_empty_run_dir(self, tmp_path: Path) -> None:
        with raw_http_server(b"") as url:
            pass
        p = _kvwatch("loadgen", "run", "--url", url, "--rate", "1", "--duration", "1",
                     "--run-dir", str(tmp_path / "r"))  # fmt: skip
        assert p.returncode == 3 and not (tmp_path / "r").exists()

    def test_unreachable_target(self) -> None:
        with raw_http_server(b"") as url:
            pass
        p = _kvwatch("loadgen", "run", "--url", url, "--rate", "1", "--duration", "1")
        assert p.returncode == 3 and "cannot reach" in p.stderr

    @pytest.mark.parametrize(
        "args",
        [
            ["--rate", "1"],
            ["--rate", "1", "--concurrency", "2"],
            ["--stage", "poisson:rate=1"],
            ["--sweep", "rate=a"],
            ["--rate", "1", "--duration", "1", "--request-timeout", "0"],
        ],
    )
    def test_bad_load_specs(self, args: list[str]) -> None:
        p = _kvwatch("loadgen", "run", "--url", "http://127.0.0.1:9", *args)
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.strip()


class TestSeeded:
    def test_same_seed_same_schedule_and_workload(self, tmp_path: Path) -> None:
        runs = []
        with fake_openai() as (base, _):
            for i in range(2):
                stage = "gamma:rate=40,burstiness=0.3@1s"
                _kvwatch("loadgen", "run", "--url", base, "--stage", stage, "--seed", "11",
                         "--output-len", "uniform:1,9", "--no-progress",
                         "--run-dir", str(tmp_path / str(i)))  # fmt: skip
                lines = (tmp_path / str(i) / "requests.jsonl").read_text().splitlines()
                runs.append([json.loads(x) for x in lines])
        a, b = runs
        assert len(a) == len(b) > 10
        assert [r["expected_output_tokens"] for r in a] == [r["expected_output_tokens"] for r in b]
        # send times are the stage start plus seeded offsets: the intervals repeat exactly
        ia = [y["scheduled_at"] - x["scheduled_at"] for x, y in zip(a, a[1:], strict=False)]
        ib = [y["scheduled_at"] - x["scheduled_at"] for x, y in zip(b, b[1:], strict=False)]
        assert ia == pytest.approx(ib, abs=1e-6)
