"""The parsers of `kvwatch loadgen ...`: the load generator and the local target it drives;
their handlers are cmd_run.py, cmd_search.py and cmd_local.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import (
    handler,
    http_url,
    nonnegative_finite,
    nonnegative_int,
    port_number,
    positive_finite,
    positive_fraction,
    positive_int,
    seed_number,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("loadgen", help="drive a vLLM server and record what each request saw")
    lsub = p.add_subparsers(dest="loadgen_command", required=True, metavar="SUBCOMMAND")

    b = lsub.add_parser(
        "build-model",
        help="build the tiny local Llama (random weights, local tokenizer) used by tests and demo",
        description="Build the tiny ~30M-parameter Llama into the cache directory "
        "($KVWATCH_CACHE or ~/.cache/kvwatch) and print its path. Reuses a complete earlier build.",
    )
    b.add_argument("--cache-dir", type=Path, help="where models are kept")
    b.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    b.add_argument(
        "--size",
        choices=["tiny", "small"],
        default="tiny",
        help="tiny: 30M parameters (tests, demo); small: 200M, compute-bound on CPU",
    )
    b.set_defaults(func=handler("kvwatch.loadgen.cmd_local:run_build_model"))

    s = lsub.add_parser(
        "serve-local",
        help="start a local vLLM OpenAI server (CPU or GPU) and keep it running until stopped",
        description="Start a vLLM OpenAI-compatible server on 127.0.0.1 with a chosen KV cache "
        "budget, print its base URL and log path, and run until Ctrl-C or SIGTERM. Arguments after "
        "'--' go to vLLM unchanged (e.g. -- --max-num-seqs 8).",
    )
    s.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    s.add_argument("--port", type=port_number, help="port (default: a free one)")
    s.add_argument(
        "--kv-cache-bytes", type=positive_int, default=10 * 1024 * 1024,
        help="KV cache budget in bytes, passed as --kv-cache-memory-bytes (default: 10 MiB, "
        "40 blocks of 32 tokens with the tiny model)",
    )  # fmt: skip
    s.add_argument(
        "--block-size", type=positive_int, default=32, help="KV block size (CPU: multiple of 32)"
    )
    s.add_argument("--max-model-len", type=positive_int, default=1024)
    s.add_argument("--log", type=Path, default=Path("vllm-server.log"), help="server log file")
    s.add_argument(
        "--start-timeout", type=positive_finite, default=180.0, help="seconds to wait for /health"
    )
    s.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra vLLM arguments after --")
    s.set_defaults(func=handler("kvwatch.loadgen.cmd_local:run_serve_local"))

    _register_run(lsub)
    _register_search(lsub)


def _length(text: str) -> str:
    """An argparse `type` for a length distribution: checked where it enters (a bad one with
    an unreachable --url said "cannot reach", hiding the real mistake); kept as its text."""
    from kvwatch.loadgen.workload.lengths import DatasetError, parse_length

    try:
        parse_length(text)
    except DatasetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


_EPILOG = """stages (repeat --stage for a multi-stage schedule):
  poisson:rate=4@30s   gamma:rate=4,burstiness=0.5@60s   constant:rate=2#100
  ramp:start=1,end=10@60s   concurrency:n=16@45s#500      (@SECONDS and/or #COUNT)
  burst:size=8,every=12@72s (8 at once every 12 s)
examples:
  kvwatch loadgen run --url http://127.0.0.1:8000 --rate 4 --duration 60
  kvwatch loadgen run --url URL --concurrency 32 --requests 200 --input-len uniform:100,300
  kvwatch loadgen run --url URL --sweep rate=1,2,4,8 --duration 30 --slo ttft=500ms,tpot=50ms
  kvwatch loadgen run --url URL --stage poisson:rate=1@20s --stage poisson:rate=8@40s
  kvwatch loadgen run --url URL --sessions --rate 0.5 --duration 120 --turns uniform:2,8 \
      --think-time lognormal:5,0.5 --input-len 1000 --turn-input-len 100 --output-len 200
  kvwatch loadgen run --url URL --trace conversation_trace.jsonl --trace-window 0:600 \
      --trace-speed 2 --trace-length-scale 0.25      (Mooncake's trace, 10 min at 2x)"""


def _register_run(lsub: Any) -> None:
    r = lsub.add_parser(
        "run",
        help="drive a vLLM/OpenAI server with a load and record every request",
        description="Send streaming completions to an OpenAI-compatible server following "
        "arrival stages, record per request the scheduled and sent time, TTFT, every "
        "inter-token gap and stalls, and write a run directory (spec, requests.jsonl/.parquet, "
        "events, summary). Exit 0 if every request completed, 1 if any failed, 3 if the server "
        "cannot be reached.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _target_args(r)
    g = r.add_argument_group("load")
    g.add_argument("--stage", action="append", default=[], metavar="SPEC", help="a stage")
    g.add_argument("--rate", type=positive_finite, help="requests per second (one stage)")
    g.add_argument("--arrival", choices=["poisson", "constant", "gamma"], default="poisson")
    g.add_argument(
        "--burstiness", type=positive_finite, default=1.0, help="gamma shape (1 = Poisson)"
    )
    g.add_argument("--concurrency", type=positive_int, help="requests in flight (closed loop)")
    g.add_argument("--ramp", metavar="START,END", help="linear ramp of the rate")
    g.add_argument(
        "--sweep",
        metavar="rate=A,B,...|concurrency=A,B,...",
        help="one stage per value, each --duration/--requests long",
    )
    g.add_argument("--duration", type=positive_finite, help="seconds per stage")
    g.add_argument("--requests", type=positive_int, help="requests per stage")
    g.add_argument(
        "--warmup",
        type=nonnegative_finite,
        default=0.0,
        metavar="SECONDS",
        help="run the first stage's pattern this long first, left out of the summary",
    )
    _request_args(g)
    _workload_args(r.add_argument_group("workload"))
    _session_args(r.add_argument_group("sessions (multi-turn conversations and agents)"))
    _trace_args(r.add_argument_group("trace replay (the trace is the load and the workload)"))
    _probe_args(r.add_argument_group("bystander probes (reported apart from the load)"))
    o = r.add_argument_group("output")
    o.add_argument("--run-dir", type=Path, help="default runs/loadgen-TIME")
    o.add_argument("--slo", default="", help="e.g. ttft=500ms,tpot=50ms for goodput")
    o.add_argument(
        "--stall-factor",
        type=positive_finite,
        default=5.0,
        help="a gap above FACTOR x the request's median gap is a stall (5)",
    )
    o.add_argument(
        "--stall-min", type=nonnegative_finite, default=0.25, help="and above this many s (0.25)"
    )
    o.add_argument("--json", action="store_true", help="print the summary as JSON")
    o.add_argument("--no-progress", action="store_true", help="no live progress line")
    o.add_argument(
        "--kv-events",
        metavar="ENDPOINT",
        type=_kv_endpoint,
        help="record the server's KV events during the run (vLLM's --kv-events-config "
        "publisher, e.g. tcp://127.0.0.1:5557) into kv_events.bin: `kvwatch advise --run DIR` "
        "draws the prefix cache's hit rate at every size from them",
    )
    o.add_argument(
        "--kv-report",
        action="store_true",
        help="ask vLLM (0.32+) to publish each request's prefix-cache hits in its KV events "
        "(vllm_xargs kv_cache_report_mode=full): the curve then knows every hit instead of "
        "inferring them from the blocks stored",
    )
    o.add_argument(
        "--kv-events-replay",
        metavar="ENDPOINT",
        type=_kv_endpoint,
        help="the publisher's replay endpoint, to recover batches lost in a gap",
    )
    r.set_defaults(func=handler("kvwatch.loadgen.cmd_run:run_load"))


def _kv_endpoint(text: str) -> str:
    from kvwatch.sidecar.kvevents.subscriber import check_endpoint

    try:
        return check_endpoint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _session_args(g: Any) -> None:
    g.add_argument(
        "--sessions", action="store_true",
        help="each arrival (or stream of --concurrency) is a conversation: every turn resends "
        "the whole conversation so far in exact tokens (earlier prompts and the server's own "
        "answers) plus a new message; --input-len opens it, --shared-prefix is a system "
        "prompt all sessions share, --requests caps the sessions",
    )  # fmt: skip
    g.add_argument("--turns", default="4", metavar="DIST", help="turns per session (4)")
    g.add_argument("--think-time", default="0", metavar="DIST",
                   help="seconds between an answer and the next turn, e.g. lognormal:5,0.5 "
                   "(0)")  # fmt: skip
    g.add_argument("--turn-input-len", default="64", metavar="DIST",
                   help="tokens of each later turn's new message (64)")  # fmt: skip
    g.add_argument("--fanout", type=positive_int, default=1, metavar="N",
                   help="agentic: each turn after the first is N parallel calls over the "
                   "context, joined before the next (1)")  # fmt: skip


def _probe_args(g: Any) -> None:
    g.add_argument(
        "--probe-rate", type=positive_finite, metavar="PER_S",
        help="send small probe requests at this fixed rate beside the load, on connections of "
        "their own, through every stage; their latencies (what the load does to everyone else) "
        "are reported apart and left out of the load's figures",
    )  # fmt: skip
    g.add_argument("--probe-input-len", type=positive_int, default=64, metavar="TOKENS",
                   help="prompt tokens of each probe (default 64)")  # fmt: skip
    g.add_argument("--probe-output-len", type=positive_int, default=16, metavar="TOKENS",
                   help="output tokens of each probe (default 16)")  # fmt: skip


def _metrics_source(text: str) -> str:
    return "none" if text == "none" else http_url(text)


def _trace_args(g: Any) -> None:
    g.add_argument(
        "--trace", type=Path, metavar="FILE",
        help="replay a timestamped trace: Mooncake JSONL (hash_ids become shared prompt "
        "prefixes), Azure LLM inference CSV, or kvwatch JSONL (t, input_tokens, output_tokens); "
        "--requests and --duration cap it",
    )  # fmt: skip
    g.add_argument("--trace-format", choices=["mooncake", "azure", "kvwatch"],
                   help="the trace's format (default: told from the file)")  # fmt: skip
    g.add_argument("--trace-speed", type=positive_finite, default=1.0, metavar="X",
                   help="replay X times as fast (0.5: half as fast) (1)")  # fmt: skip
    g.add_argument("--trace-speed-end", type=positive_finite, metavar="Y",
                   help="the speed at the replay's end: it moves evenly in replay time from "
                   "--trace-speed to Y, a ramp with the trace's own arrivals (1 to 4: the "
                   "last requests come 4 times as fast as recorded)")  # fmt: skip
    g.add_argument("--trace-window", metavar="START:END",
                   help="only the requests between these trace seconds")  # fmt: skip
    g.add_argument("--trace-length-scale", type=positive_finite, default=1.0, metavar="F",
                   help="multiply every length (and the shared blocks) by F, to fit a "
                   "model's context (1); a request still too long for the server's "
                   "max_model_len is clipped to it, and counted")  # fmt: skip
    g.add_argument("--trace-block-tokens", type=positive_int, metavar="N",
                   help="tokens per hash_ids block (Mooncake's: 512)")  # fmt: skip


def _target_args(r: Any) -> None:
    r.add_argument(
        "--url", required=True, type=http_url, help="server base URL, e.g. http://127.0.0.1:8000"
    )
    r.add_argument("--model", help="model name (default: the first /v1/models lists)")
    r.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    r.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding an API key, if any (OPENAI_API_KEY)",
    )


def _request_args(g: Any) -> None:
    g.add_argument(
        "--max-inflight", type=positive_int, help="cap on open requests (extra ones wait)"
    )
    g.add_argument(
        "--request-timeout",
        type=positive_finite,
        default=600.0,
        metavar="S",
        help="a response silent this long is recorded as a ReadTimeout error (600)",
    )
    g.add_argument(
        "--sidecar",
        metavar="URL",
        type=http_url,
        help="a kvwatch sidecar to tell stage starts and ends (for marks and annotations)",
    )
    g.add_argument(
        "--server-metrics",
        metavar="URL|none",
        type=_metrics_source,
        help="the vLLM whose /metrics the run samples for its timeline and server figures "
        "(default: --url). Behind a router give one replica's URL, or none: a router "
        "answers /metrics from a replica of its choosing, and counts each sample as a "
        "request in its policy (round robin shifts)",
    )
    g.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="sender processes (1); more for loads one core cannot send on time",
    )


def _workload_args(w: Any) -> None:
    w.add_argument(
        "--input-len", default="128", type=_length, metavar="DIST", help="prompt tokens (128)"
    )
    w.add_argument(
        "--output-len",
        default=None,
        type=_length,
        metavar="DIST",
        help="output tokens (128; datasets: the recorded reply's length)",
    )
    w.add_argument("--dataset", type=Path, help="ShareGPT JSON/JSONL or JSONL with prompt")
    w.add_argument(
        "--shared-prefix",
        type=nonnegative_int,
        default=0,
        metavar="TOKENS",
        help="common prefix length for every prompt",
    )
    w.add_argument("--prefix-groups", type=positive_int, default=1, help="distinct shared prefixes")
    w.add_argument(
        "--priorities", metavar="P:SHARE,...",
        help="priority classes, e.g. 0:0.2,1:0.8: each request (or session) carries vLLM's "
        "`priority` (lower runs first under --scheduling-policy priority); results and stalls "
        "are reported per class",
    )  # fmt: skip
    w.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early")
    w.add_argument("--seed", type=seed_number, default=0)


_SEARCH_EPILOG = """how it searches:
  Each probe is one load held for --probe-requests (concurrency) or --probe-duration (rate).
  The load doubles from --start until a load misses the SLOs, then bisection narrows the
  highest passing and the lowest failing load (concurrency: to neighbours, rate: to
  --precision). Each load is probed --repeats times and judged on all its requests pooled;
  while the 95% interval of that share straddles --attainment, it is probed again (up to
  --max-repeats). The KV onset, the lowest load whose probes preempted, is narrowed the same
  way, from the server's preemption counter (or the sidecar's, with --sidecar).
exit status: 0 a maximum was found, 1 no load probed met the SLOs, 2 usage, 3 unreachable.
examples:
  kvwatch loadgen search --url http://127.0.0.1:8000 --slo ttft=500ms,tpot=50ms
  kvwatch loadgen search --url URL --slo e2e=20s --by rate --start 0.5 --probe-duration 60
  kvwatch loadgen search --url URL --slo tpot=50ms --calibration cal.json  (forecast first)
  kvwatch report runs/search-20261201-120000      (the capacity page)"""


def _register_search(lsub: Any) -> None:
    r = lsub.add_parser(
        "search",
        help="find the highest load that meets the SLOs, and the load where preemption starts",
        description="Probe a vLLM/OpenAI server at rising loads to find (a) the highest load "
        "whose requests meet every SLO at the --attainment share, and (b) the KV onset, the "
        "lowest load at which the server preempts. Says which limit binds first (the KV cache "
        "or compute), gives the sizing advice at that point, and writes a run directory: "
        "search.json and one run directory per probe under probes/; `kvwatch report DIR` "
        "draws the capacity page.",
        epilog=_SEARCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _target_args(r)
    g = r.add_argument_group("search")
    g.add_argument(
        "--slo", required=True, help="every request must meet these, e.g. ttft=500ms,tpot=50ms"
    )
    add = g.add_argument
    add(
        "--by",
        choices=["concurrency", "rate"],
        default="concurrency",
        help="what to raise: requests in flight, or Poisson arrivals per second (concurrency)",
    )
    add(
        "--attainment",
        type=positive_fraction,
        default=0.95,
        help="the share of requests that must meet the SLOs (0.95)",
    )
    add(
        "--start",
        type=positive_finite,
        help="the first load (1; with --calibration, half the forecast limit)",
    )
    add(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="step-time constants fitted to this server (`kvwatch calibrate`): forecast the "
        "SLO limit and the KV onset from the server's own cache before probing, start below "
        "the forecast, and print it beside what the probes find (--by concurrency)",
    )
    add(
        "--max",
        type=positive_finite,
        default=256.0,
        dest="max_load",
        help="never probe above this load (256)",
    )
    add(
        "--precision",
        type=positive_finite,
        default=0.1,
        help="rate: stop when the bracket is this fraction of its top (0.1)",
    )
    add("--repeats", type=positive_int, default=2, help="probes per load (2)")
    add(
        "--max-repeats",
        type=positive_int,
        default=4,
        help="probes per load while its verdict is not yet decided at 95%% (4)",
    )
    add(
        "--probe-requests",
        type=positive_int,
        metavar="N",
        help="requests per probe (concurrency: default 4 x the load, at least 16)",
    )
    add(
        "--probe-duration",
        type=positive_finite,
        metavar="S",
        help="seconds per probe (rate: default 30)",
    )
    _request_args(g)
    _workload_args(r.add_argument_group("workload"))
    o = r.add_argument_group("output")
    o.add_argument("--run-dir", type=Path, help="default runs/search-TIME")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("--no-progress", action="store_true", help="no live progress line")
    r.set_defaults(func=handler("kvwatch.loadgen.cmd_search:run_search"))
