"""Every stall's cause, as the load generator reads it, held to the twin's step trace.

The GPU twin (vLLM's own engine, the card simulated; `kvwatch twin --step-trace`) writes what
each engine step carried: new prompt tokens, recomputed tokens, the requests it preempted or
left out, when the card finished it. `loadgen/results/stall_truth.py` reads the true cause of
every stall from that; `loadgen/results/stall_causes.py` names one from what a client can see
of any vLLM (the other streams, the server's counters once a second). This bench runs loads
where each cause happens and reports how often the two agree, per load and per cause.

  thrash   Llama 3.1 8B on an H100 with 2 GiB of KV: Poisson arrivals of 1024 + 512 tokens
           at 6/s outgrow the cache: victims, and the streams behind their recompute
  prefill  the same card with 24 GiB: 32 closed-loop streams of 128 + 1024 tokens, and beside
           them prompts of 12,000 tokens at 1/s (a second load generator): each prefill step
           stalls every stream (`--max-num-batched-tokens 16384`, one chunk a prompt)
  burst    2 GiB, 48 requests of 256 + 1024 tokens at once and no more: their growth
           thrashes, and the steps that recompute the victims carry no new prompt
  mixed    2 GiB, Poisson 1024 + 512 tokens at 4/s and 4,000-token prompts at 0.5/s beside

Held out (the rules were chosen on the four above; these are part 2's kinds, judged once):
  ramp-poisson   2 GiB, Poisson arrivals of 1024 + 512 tokens rising from 1/s to 8/s in 60 s
  ramp-bursty    the same ramp with gamma gaps (burstiness 0.25, cv 2)
  sessions       2 GiB, conversations of 4 turns (each resends the conversation and adds 200
                 tokens; 1000 + 300 first) arriving at a rate rising from 0.3/s to 2/s
  trace-azure    1 GiB, Azure's conversation slice (tests/data/traces, 120 requests in 46 s)
                 replayed 3 times as fast
  trace-mooncake 4 GiB, Mooncake's conversation slice (tests/data/traces, 42 s) at a tenth of
                 its lengths (prompts of 700-8,700 tokens sharing prefixes by `hash_ids`)

Beside each load the bench scrapes the twin's /metrics once a second (`{load}-scrapes.jsonl`)
and replays the scrapes through the sidecar's own state (SidecarState.record_scrape, as its
scrape loop feeds it), which judges stall seconds by cause from the server's side alone
(sidecar/judge/stall_seconds.py: preemption, prefill, other); the row holds its figures
against the true seconds of the same causes (the clients' stalls, wall seconds divided by the
time scale: the sidecar judges a twin on its clock). `--rejudge` replays them again.

Results: bench/results/stall-causes.json, docs/loadgen.md. Twin figures, wall time (time scale
`--time-scale`, default 2: this machine's API server keeps up with the card).

    PYTHONPATH=. .venv/bin/python bench/bench_stall_causes.py [--only thrash] [--seconds 60]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from kvwatch.loadgen.results.rundir import read_jsonl, read_records
from kvwatch.loadgen.results.stall_causes import CAUSES, ServerCounters, attribute_stalls
from kvwatch.loadgen.results.stall_truth import truth_causes
from kvwatch.loadgen.results.step_trace import read_step_trace
from kvwatch.sidecar.judge.stall_seconds import MIN_S, SERVER_CAUSES
from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.metrics.twin import read_time_scale
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.twin.serve import start_twin

HERE = Path(__file__).resolve().parent
GIB = 2**30
# name: (KV bytes, the loads run side by side (the first is judged), vLLM arguments)
LOADS: dict[str, tuple[int, list[list[str]], tuple[str, ...]]] = {
    "thrash": (2 * GIB, [["--rate", "6", "--input-len", "1024", "--output-len", "512"]],
               ("--max-model-len", "4096")),
    "prefill": (
        24 * GIB,
        [["--concurrency", "32", "--input-len", "128", "--output-len", "1024"],
         ["--rate", "1", "--input-len", "12000", "--output-len", "8"]],
        ("--max-model-len", "16384", "--max-num-batched-tokens", "16384"),
    ),
    "burst": (
        2 * GIB,
        [["--concurrency", "48", "--requests", "48", "--input-len", "256",
          "--output-len", "1024"]],
        ("--max-model-len", "4096"),
    ),
    "mixed": (
        2 * GIB,
        [["--rate", "4", "--input-len", "1024", "--output-len", "512"],
         ["--rate", "0.5", "--input-len", "4000", "--output-len", "8"]],
        ("--max-model-len", "8192", "--max-num-batched-tokens", "8192"),
    ),
}  # fmt: skip
TRACES = HERE.parent / "tests" / "data" / "traces"
HELD_OUT: dict[str, tuple[int, list[list[str]], tuple[str, ...]]] = {
    "ramp-poisson": (2 * GIB, [["--stage", "ramp:start=1,end=8,poisson=1@60s",
                                "--input-len", "1024", "--output-len", "512"]],
                     ("--max-model-len", "4096")),
    "ramp-bursty": (2 * GIB, [["--stage", "ramp:start=1,end=8,burstiness=0.25@60s",
                               "--input-len", "1024", "--output-len", "512"]],
                    ("--max-model-len", "4096")),
    "sessions": (2 * GIB, [["--stage", "ramp:start=0.3,end=2,poisson=1@60s", "--sessions",
                            "--turns", "4", "--turn-input-len", "200", "--input-len", "1000",
                            "--output-len", "300"]],
                 ("--max-model-len", "8192")),
    "trace-azure": (GIB, [["--trace", str(TRACES / "azure-llm-conv-2023-first120.csv"),
                           "--trace-speed", "3"]],
                    ("--max-model-len", "4096")),
    "trace-mooncake": (4 * GIB, [["--trace", str(TRACES / "mooncake-conversation-first120.jsonl"),
                                  "--trace-length-scale", "0.1"]],
                       ("--max-model-len", "16384")),
}  # fmt: skip
ALL = {**LOADS, **HELD_OUT}
# the client's causes as the server can tell them apart (sidecar/judge/stall_seconds.py)
SERVER_VIEW = {"preempted": "preemption", "recompute": "preemption", "prefill": "prefill",
               "queue": "other", "host": "other", "unknown": "other"}  # fmt: skip
# the load sets its own length: a stage's duration, a request count, a trace
_SELF_TIMED = ("--requests", "--stage", "--trace")


def _run(
    name: str,
    seconds: float,
    time_scale: float,
    work: Path,
    budget: int | None = None,
    long_prefill: int | None = None,
) -> dict[str, Any]:
    kv, loads, vllm_args = ALL[name]
    if budget is not None:  # the prompt budget advised, as `advise --run` gave it
        i = vllm_args.index("--max-num-batched-tokens")
        vllm_args = (*vllm_args[: i + 1], str(budget), *vllm_args[i + 2 :])
    if long_prefill is not None:  # the advice's other lever: each long prompt's chunk capped
        vllm_args = (*vllm_args, "--long-prefill-token-threshold", str(long_prefill))
    trace = work / f"{name}-steps.jsonl"
    with (
        start_twin(
            "llama-3.1-8b",
            "h100",
            work / f"{name}-vllm.log",
            time_scale=time_scale,
            status_dir=work,
            step_trace=trace,
            vllm_args=("--kv-cache-memory-bytes", str(kv), *vllm_args),
        ) as twin,
        _Scraper(twin.base_url, work / f"{name}-scrapes.jsonl"),
    ):
        procs = []
        for i, load in enumerate(loads):
            run_dir = work / f"{name}-{i}"
            cmd = [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
                   "--run-dir", str(run_dir), "--no-progress", "--seed", str(7 + i),
                   *(() if set(_SELF_TIMED) & set(load) else ("--duration", str(seconds))),
                   *load]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for p in procs:
            _, err = p.communicate(timeout=seconds * 10 + 300)
            if p.returncode not in (0, 1):
                raise SystemExit(f"{name}: loadgen failed ({p.returncode}): {err[-800:]!r}")
        time.sleep(2.5)  # the trace is flushed a second apart; the last scrapes
    row = _judge(name, work, rejudge=False)
    row["vllm_args"] = list(vllm_args)
    row["clients"] = [_client(work / f"{name}-{i}") for i in range(len(loads))]
    return row


def _client(run_dir: Path) -> dict[str, Any]:
    """What one load generator saw: its stalls by cause, TTFT and tokens/s."""
    o = json.loads((run_dir / "summary.json").read_text())["overall"]
    causes = o.get("stall_causes") or {}
    return {"stalls": o["stalls"], "stall_s": sum(v["seconds"] for v in causes.values()),
            "causes": causes, "ttft_p50": o["ttft"]["p50"], "ttft_p99": o["ttft"]["p99"],
            "itl_p50": o["itl"]["p50"], "output_tok_s": o["output_token_throughput"],
            "completed": o["completed"]}  # fmt: skip


def _judge(name: str, work: Path, rejudge: bool) -> dict[str, Any]:
    """The run's stall causes (as the load generator wrote them, or judged again from its
    records and timeline with today's code: `rejudge`) against the step trace's."""
    kv, loads, vllm_args = ALL[name]
    time_scale = float(json.loads((work / "card.json").read_text()).get("time_scale") or 1.0)
    steps, bad = read_step_trace(work / f"{name}-steps.jsonl")
    run_dir = work / f"{name}-0"
    records = read_records(run_dir)
    start_unix = float(json.loads((run_dir / "spec.json").read_text())["start_unix"])
    if rejudge:
        rows = read_jsonl(run_dir / "timeline.jsonl")
        attribute_stalls(records, ServerCounters(rows), start_unix)
    truth = truth_causes(records, steps, start_unix)
    pairs = []
    for r in records:
        if r.get("server_id") in truth:
            pairs += list(zip(truth[r["server_id"]], r.get("stall_causes") or [], strict=False))
    server = _server_view(name, work, len(loads), steps, time_scale)
    agree = sum(t == a for t, a in pairs)
    by_truth: dict[str, dict[str, int]] = {}
    for t, a in pairs:
        by_truth.setdefault(t, dict.fromkeys(CAUSES, 0))[a] += 1
    return {
        "load": name,
        "held_out": name in HELD_OUT,
        "rejudged": rejudge,
        "kv_bytes": kv,
        "loads": loads,
        "vllm_args": list(vllm_args),
        "steps": len(steps),
        "bad_trace_lines": bad,
        "preemptions": sum(len(s.preempted) for s in steps),
        "stalls": len(pairs),
        "agree": agree,
        "agreement": agree / len(pairs) if pairs else None,
        "truth": dict(collections.Counter(t for t, _ in pairs)),
        "attributed": dict(collections.Counter(a for _, a in pairs)),
        "by_truth": by_truth,  # true cause -> what was attributed
        "server_view": server,
    }


class _Scraper:
    """The server's /metrics once a second, each body with its monotonic time, to a file."""

    def __init__(self, base_url: str, path: Path) -> None:
        self.url, self.path = base_url + "/metrics", path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.path.open("w") as out, httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    body = client.get(self.url).text
                except httpx.HTTPError:
                    body = None  # a scrape the sidecar would have counted as failed
                out.write(json.dumps({"t": t, "body": body}) + "\n")
                self._stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _sidecar_stalls(path: Path) -> dict[str, float]:
    """The recorded scrapes replayed through the sidecar's state: its stall seconds by cause."""
    url = "http://twin"
    state = SidecarState([url])
    last = 0.0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        last, body = float(row["t"]), row["body"]
        outcome = (
            ScrapeOutcome(0.01, error_reason="connect", error="no answer")
            if body is None
            else ScrapeOutcome(0.01, parse_exposition(body), time_scale=read_time_scale(body))
        )
        state.record_scrape(url, last, outcome)
    said = dict.fromkeys(SERVER_CAUSES, 0.0)
    for t in state.view(last).targets:
        for e in t.engines:
            for cause, c in e.stalls.items():
                said[cause] += c.seconds
    return said


def _server_view(
    name: str, work: Path, clients: int, steps: list[Any], time_scale: float
) -> dict[str, Any] | None:
    """The sidecar's stall seconds by cause against the true seconds of every client's stalls
    as the server can tell causes apart (SERVER_VIEW), on the twin's clock; only the stalls of
    0.25 s or more of it, the sidecar's floor (the clients' is 0.25 s of wall time)."""
    path = work / f"{name}-scrapes.jsonl"
    if not path.exists():
        return None
    said = _sidecar_stalls(path)
    true = dict.fromkeys(SERVER_CAUSES, 0.0)
    for i in range(clients):
        run_dir = work / f"{name}-{i}"
        records = read_records(run_dir)
        start_unix = float(json.loads((run_dir / "spec.json").read_text())["start_unix"])
        truth = truth_causes(records, steps, start_unix)
        for r in records:
            for cause, (s, e) in zip(truth.get(r.get("server_id"), []), r.get("stall_spans") or [],
                                     strict=False):  # fmt: skip
                if (e - s) / time_scale >= MIN_S:
                    true[SERVER_VIEW[cause]] += (e - s) / time_scale
    total_said, total_true = sum(said.values()), sum(true.values())
    # seconds given the cause the steps show, as a share of the true seconds: the sidecar's
    # seconds scaled to the true total first (so that over-counting all of them hides no
    # misattribution), then per cause the smaller of the two sides
    k = total_true / total_said if total_said else 0.0
    matched = sum(min(said[c] * k, true[c]) for c in SERVER_CAUSES)
    return {"sidecar_seconds": said, "true_seconds": true,
            "total_ratio": total_said / total_true if total_true else None,
            "matched_share": matched / total_true if total_true else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(ALL), action="append")
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="run the held-out loads (default: the four the rules were chosen on)",
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument(
        "--long-prefill",
        type=int,
        metavar="TOKENS",
        help="add --long-prefill-token-threshold TOKENS (the advice's other lever)",
    )
    ap.add_argument("--budget", type=int, metavar="TOKENS",
                    help="this --max-num-batched-tokens instead (the advice's rerun)")  # fmt: skip
    ap.add_argument("--keep", type=Path, metavar="DIR", help="leave the runs and traces here")
    ap.add_argument("--rejudge", type=Path, metavar="DIR",
                    help="judge the runs kept in DIR again with today's code (no twin) and "
                    "write the results file again")  # fmt: skip
    ns = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory(prefix="kvwatch-stalls-") as tmp:
        work = ns.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in ns.only or list(HELD_OUT if ns.held_out else LOADS):
            if ns.rejudge:
                row = _judge(name, ns.rejudge, rejudge=True)
                n_clients = len(ALL[name][1])
                row["clients"] = [_client(ns.rejudge / f"{name}-{i}") for i in range(n_clients)]
            else:
                row = _run(name, ns.seconds, ns.time_scale, work, ns.budget, ns.long_prefill)
            out.append(row)
            share = row["agreement"]
            print(f"{name}: {row['stalls']} stalls, {row['agree']} agree "
                  f"({'-' if share is None else f'{share:.0%}'}); truth {row['truth']}; "
                  f"attributed {row['attributed']}; {row['preemptions']} preemptions, "
                  f"{row['steps']} steps", flush=True)  # fmt: skip
            for t, got in row["by_truth"].items():
                print(f"  truly {t}: { ({k: v for k, v in got.items() if v}) }", flush=True)
            if (sv := row["server_view"]) is not None:
                said = {k: round(v, 1) for k, v in sv["sidecar_seconds"].items()}
                true = {k: round(v, 1) for k, v in sv["true_seconds"].items()}
                share, ratio = sv["matched_share"], sv["total_ratio"]
                print(f"  sidecar's stall seconds {said}, truly {true}; causes matched "
                      f"{'-' if share is None else f'{share:.0%}'}, seconds "
                      f"{'-' if ratio is None else f'{ratio:.2f}x'}", flush=True)  # fmt: skip
    result = {"time_scale": ns.time_scale, "seconds": ns.seconds,
              "date": time.strftime("%Y-%m-%d"), "runs": out}  # fmt: skip
    if ns.rejudge:  # the kept runs judged again: the file the run wrote, now with today's code
        result["rejudged"] = str(ns.rejudge)
    dest = HERE / "results" / "stall-causes.json"
    if ns.only or ns.budget or ns.held_out or ns.long_prefill:
        tag = "-".join(ns.only) if ns.only else ("held-out" if ns.held_out else "")
        tag += f"-budget-{ns.budget}" if ns.budget else ""
        tag += f"-long-prefill-{ns.long_prefill}" if ns.long_prefill else ""
        dest = dest.with_name(f"stall-causes-{tag.strip('-')}.json")
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
