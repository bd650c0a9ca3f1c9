"""The CLI fuzzer: command lines drawn from kvwatch's own argparse parsers, every flag of every
command, and the property each must keep.

`command_flags()` walks `kvwatch.cli.build_parser()`, so a flag added tomorrow is fuzzed
tomorrow with no list to update. `argv_for()` starts from a command's smallest working line
(`BASES`) and adds flags drawn from that command's parser, each given a hostile or a good value
(numbers: 0, negatives, nan, inf, huge ints, floats where ints are meant; strings: empty,
unicode, long, shell metacharacters; paths: a folder, a missing file, junk, /dev/null; URLs
that are no server or none at all; structured values such as `uniform:1,nan` made by mutating
a good one). `run_cli()` runs it in this process, stopped where real work would start: a child
process (vLLM, the twin, Prometheus) or the sidecar's loop raises `Started`, since the fuzzer
tests what is refused and how, not vLLM. `check()` holds the property:

- the exit code is 0, 1, 2 or 3 (or the line reached the start of its work);
- a refused line says why on one line starting `kvwatch`, with no traceback;
- it ends within `DEADLINE_S` (a hang raises `Hung` from a SIGALRM).

tests/test_fuzz_cli.py runs it under hypothesis in CI; bench/bench_fuzz_cli.py runs 10^4 cases a
command with plain random draws.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Flag", "Started", "Hung", "Outcome", "command_flags", "Fixtures", "argv_for", "run_cli",
    "check", "BASES", "DEADLINE_S", "fuzz_one",
]  # fmt: skip

DEADLINE_S = 20.0
DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback here

NUMBERS = [
    "0", "-0", "-3", "1", "2", "7", "0.5", "1.5", "1e-320", "nan", "NaN", "inf", "-inf", "1e309",
    "9" * 25, "-" + "9" * 25, "0x10", "1_000", " 3", "3 ", "1e3", "2.0",
]  # fmt: skip
STRINGS = [
    "", " ", "\u00e9\u2603", "a" * 300, "-", "--x", "=", ",", ":", "@", "#", "%s", "{}", "\t",
    "a\nb", "x;touch${IFS}PWNED", "$(id)", "../..", "\u202e", "\udcff",
]  # fmt: skip
URLS = [
    DEAD_URL, "http://", "ftp://127.0.0.1/", "http://127.0.0.1:99999", "http://[::1",
    "http://u:p@127.0.0.1:9", "127.0.0.1:9", "http://127.0.0.1:0",
]  # fmt: skip

# Structured values, mutated by replacing their numbers with hostile ones.
GOOD: dict[str, list[str]] = {
    "--input-len": ["128", "uniform:100,300", "normal:100,10", "lognormal:100,0.5", "fixed:64"],
    "--output-len": ["128", "uniform:10,30"],
    "--turns": ["4", "uniform:2,8"],
    "--think-time": ["0", "1", "exp:2", "lognormal:5,0.5", "uniform:0,3"],
    "--turn-input-len": ["64", "uniform:10,100"],
    "--stage": ["poisson:rate=4@30s", "gamma:rate=4,burstiness=0.5@6s", "constant:rate=2#10",
                "ramp:start=1,end=10@6s", "concurrency:n=16@5s#50", "burst:size=8,every=12@72s"],
    "--ramp": ["1,10"],
    "--sweep": ["rate=1,2,4", "concurrency=1,2"],
    "--slo": ["ttft=500ms,tpot=50ms", "ttft=1s", "e2e=10s"],
    "--trace-window": ["0:600", "10:20"],
    "--priorities": ["0:0.8,1:0.2", "2:1"],
    "--step": ["decode_ms=10", "prefill_tokens_per_s=5000"],
    "--threshold": ["thrash_rate=0.5", "usage_high=0.9"],
    "--listen": ["127.0.0.1:0", "0.0.0.0:9477", "[::1]:0", "127.0.0.1:99999"],
    "--webhook": [f"{DEAD_URL}/hook", f"{DEAD_URL}/hook,slack", f"{DEAD_URL},nope"],
    "--twin": ["llama-3.1-8b:h100", "qwen3-8b:h200", "x:y"],
    "--window": ["1h", "15m", "0s"],
    "--step-ms": ["12"],
    "--kv-cache-memory-bytes": ["8000000000", "8GB", "8GiB"],
    "--kv-dtype": ["auto", "fp8", "bf16", "int3"],
    "--kv-cache-dtype": ["auto", "fp8", "bf16", "int3"],
    "--model": ["llama-3.1-8b", "qwen3-8b", "gpt-oss-120b", "deepseek-v3", "no-such-model"],
    "--gpu": ["h100", "h200", "a100", "cpu", "l4", "tpu9"],
    "--vllm-version": ["0.32.0", "0.9.2", "1.0", "x"],
    "--server-metrics": [DEAD_URL, "none"],
    "--policy": ["round_robin", "cache_aware", "power_of_two", "random", "nope"],
}  # fmt: skip
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


class Started(BaseException):  # noqa: N818 (a stop, not an error: nothing catches a BaseException)
    """The line got past every check to where its real work starts."""


class Hung(BaseException):  # noqa: N818
    """The line ran past DEADLINE_S."""


@dataclass(frozen=True)
class Flag:
    name: str
    takes_value: bool
    kind: str  # int, float, url, path, choice, text, switch
    choices: tuple[str, ...] = ()


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return "choice"
    t = getattr(action.type, "__name__", "")
    if t in ("int", "whole_number"):
        return "int"
    if t in ("float", "finite_number"):
        return "float"
    if t == "http_url" or (action.metavar or "").startswith("URL"):
        return "url"
    if t == "Path" or (action.metavar or "") in ("FILE", "DIR"):
        return "path"
    return "text"


def _walk(
    parser: argparse.ArgumentParser, at: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield at, parser
        return
    for name, sp in subs[0].choices.items():
        yield from _walk(sp, (*at, name))


def command_flags() -> dict[tuple[str, ...], list[Flag]]:
    """Every command (as its words) and its optional flags, from the parsers themselves."""
    from kvwatch.cli import build_parser

    out: dict[tuple[str, ...], list[Flag]] = {}
    for words, parser in _walk(build_parser(), ()):
        flags = []
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings:
                continue
            name = max(a.option_strings, key=len)
            choices = tuple(str(c) for c in a.choices) if a.choices is not None else ()
            flags.append(Flag(name, a.nargs != 0, _kind(a), choices))
        out[words] = flags
    return out


@dataclass(frozen=True)
class Fixtures:
    """Files the drawn lines point at, made once per session under `root`."""

    root: Path
    run_dir: Path
    log: Path
    folder: Path
    missing: Path
    junk: Path
    empty: Path
    traces: tuple[Path, ...]

    @classmethod
    def make(cls, root: Path, run_dir: Path, log: Path, traces: tuple[Path, ...]) -> Fixtures:
        """Copies of `log` and `traces` under `root`: a drawn `--out` may name any of them."""
        import shutil

        root.mkdir(parents=True, exist_ok=True)
        log = Path(shutil.copy(log, root / log.name))
        traces = tuple(Path(shutil.copy(t, root / t.name)) for t in traces)
        folder = root / "a-folder"
        folder.mkdir(parents=True, exist_ok=True)
        (root / "cwd" / "a" / "b").mkdir(parents=True, exist_ok=True)
        junk = root / "junk.bin"
        junk.write_bytes(bytes(range(256)) * 4)
        empty = root / "empty.json"
        empty.write_text("")
        (root / "list.json").write_text(json.dumps([1, {"a": None}]))
        return cls(root, run_dir, log, folder, root / "missing" / "x", junk, empty, traces)

    def paths(self) -> list[str]:
        return [
            str(p)
            for p in (self.run_dir, self.log, self.folder, self.missing, self.junk, self.empty,
                      self.root / "list.json", Path("/dev/null"), *self.traces)
        ]  # fmt: skip

    def out_path(self, rng: random.Random) -> str:
        """A place a command may write: new each time, or a hostile one."""
        if rng.random() < 0.7:
            return str(self.root / "out" / f"w{rng.randrange(10**9)}")
        return rng.choice([str(self.folder), str(self.junk), str(self.missing / "y"), "/proc/x"])


# The smallest line that reaches each command's work; {run}, {log}, {out} are filled in.
BASES: dict[tuple[str, ...], list[list[str]]] = {
    ("demo",): [[], ["--target", DEAD_URL], ["--twin", "llama-3.1-8b:h100"]],
    ("advise",): [["--what-if", "--model", "llama-3.1-8b", "--gpu", "h100"],
                  ["--run", "{run}"], ["--metrics", DEAD_URL], ["--prometheus", DEAD_URL]],
    ("calibrate",): [
        [*src, "--model", "llama-3.1-8b", "--gpu", "h100"]
        for src in (["--run", "{run}"], ["--metrics", DEAD_URL], ["--sidecar", DEAD_URL],
                    ["--prometheus", DEAD_URL])
    ],  # fmt: skip
    ("report",): [["{run}", "--out", "{out}"]],
    ("alerts",): [[], ["--out", "{out}"]],
    ("runbook",): [[]],
    ("dashboards",): [["--out", "{out}"], []],
    ("sidecar",): [["--target", DEAD_URL, "--listen", "127.0.0.1:0"]],
    ("logs",): [["{log}"], ["-"]],
    ("loadgen", "build-model"): [["--cache-dir", "{out}"]],
    ("loadgen", "serve-local"): [["--port", "0"]],
    ("loadgen", "run"): [
        ["--url", DEAD_URL, "--rate", "1", "--requests", "2", "--run-dir", "{out}"],
        ["--url", DEAD_URL, "--trace", "{trace}", "--run-dir", "{out}"]],
    ("loadgen", "search"): [["--url", DEAD_URL, "--slo", "ttft=500ms", "--run-dir", "{out}"]],
    ("twin",): [["--model", "llama-3.1-8b", "--gpu", "h100"]],
    ("fleet",): [[]],
}  # fmt: skip


_FINE = {"int": ["1", "2", "3", "8"], "float": ["0.5", "1", "2.5"], "url": [DEAD_URL]}


def _good(flag: Flag, fx: Fixtures, rng: random.Random) -> str:
    if flag.name in GOOD:
        return rng.choice(GOOD[flag.name])
    if flag.kind == "choice":
        return rng.choice(flag.choices)
    if flag.kind == "path":
        return fx.out_path(rng) if flag.name in _OUTPUTS else rng.choice(fx.paths())
    return rng.choice(_FINE.get(flag.kind, ["x"]))


def _hostile(flag: Flag, fx: Fixtures, rng: random.Random) -> str:
    good = GOOD.get(flag.name)
    if good and rng.random() < 0.5:  # a number inside a structured value made hostile
        v = rng.choice(good)
        spots = list(_NUMBER.finditer(v))
        if spots:
            m = rng.choice(spots)
            return v[: m.start()] + rng.choice(NUMBERS).strip() + v[m.end() :]
    if flag.kind in ("int", "float") and rng.random() < 0.8:
        return rng.choice(NUMBERS)
    if flag.kind == "url" and rng.random() < 0.8:
        return rng.choice(URLS)
    if flag.kind == "path" and rng.random() < 0.8:
        return rng.choice([*fx.paths(), fx.out_path(rng)])
    return rng.choice(rng.choice([NUMBERS, STRINGS, URLS, fx.paths()]))


_OUTPUTS = ("--out", "--run-dir", "--work-dir", "--cache-dir", "--db", "--log")


def argv_for(
    words: tuple[str, ...], flags: list[Flag], fx: Fixtures, rng: random.Random
) -> list[str]:
    """A command line: a base, then one to four flags drawn from the command's parser, most
    given good values and (seven times in ten) one a hostile value, so that a line gets past
    argparse to the checks and the work behind it."""
    base = rng.choice(BASES.get(words, [[]]))
    fill = {"{run}": str(fx.run_dir), "{log}": str(fx.log), "{out}": fx.out_path(rng),
            "{trace}": str(rng.choice(fx.traces))}  # fmt: skip
    argv = [*words, *(fill.get(w, w) for w in base)]
    drawn = rng.sample(flags, min(len(flags), rng.randint(1, 4)))
    bad = rng.randrange(len(drawn)) if drawn and rng.random() < 0.7 else -1
    for i, flag in enumerate(drawn):
        argv.append(flag.name)
        if flag.takes_value:
            argv.append((_hostile if i == bad else _good)(flag, fx, rng))
    return argv


@dataclass(frozen=True)
class Outcome:
    argv: list[str]
    code: int | None  # None: it reached the start of its work
    stdout: str
    stderr: str
    error: BaseException | None  # anything other than an exit code or Started


class _NoChild:
    """Stands for subprocess.Popen: the line reached the point of starting a real process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise Started(f"would start {str(args[0] if args else kwargs.get('args'))[:200]}")


def _no_sidecar(*args: Any, **kwargs: Any) -> int:
    raise Started("would run the sidecar")


def _no_build(*args: Any, **kwargs: Any) -> None:
    raise Started("would build the tiny model (seconds of CPU)")


def _no_fleet(*args: Any, **kwargs: Any) -> None:
    raise Started("would bring the fleet up")


def _alarm(*_: Any) -> None:
    raise Hung(f"ran past {DEADLINE_S} s")


@contextlib.contextmanager
def _stopped_at_the_start() -> Iterator[None]:
    """Child processes and the sidecar's loop raise Started, stdin is empty, SIGALRM raises
    Hung; SIGTERM's handler and Python's own are put back after (some commands install theirs).
    """
    import multiprocessing.process as mp_process

    from kvwatch.fleet import lab
    from kvwatch.local import tiny_model
    from kvwatch.sidecar import daemon

    saved_popen, saved_run = subprocess.Popen, daemon.serve_sidecar
    saved_mp_start = mp_process.BaseProcess.start
    saved_build = tiny_model._build_tokenizer
    saved_fleet = lab.Fleet._start
    saved_stdin = sys.stdin
    saved_signals = {
        s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    }
    subprocess.Popen = _NoChild  # type: ignore[misc, assignment]
    daemon.serve_sidecar = _no_sidecar  # type: ignore[assignment]
    mp_process.BaseProcess.start = _NoChild  # type: ignore[assignment, method-assign]
    tiny_model._build_tokenizer = _no_build
    lab.Fleet._start = _no_fleet  # type: ignore[method-assign]
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""))
    # pytest-timeout's own alarm (the test's 600 s) is put back, less the time this case took
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    began = time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        subprocess.Popen = saved_popen  # type: ignore[misc]
        daemon.serve_sidecar = saved_run
        mp_process.BaseProcess.start = saved_mp_start  # type: ignore[method-assign]
        tiny_model._build_tokenizer = saved_build
        lab.Fleet._start = saved_fleet  # type: ignore[method-assign]
        sys.stdin = saved_stdin
        for s, h in saved_signals.items():
            signal.signal(s, h)
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, outer - (time.monotonic() - began)))


def run_cli(argv: list[str], cwd: Path | None = None) -> Outcome:
    """`kvwatch argv` in this process, in `cwd` (where default outputs land)."""
    import os

    from kvwatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    error: BaseException | None = None
    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    with (
        contextlib.ExitStack() as undo,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        undo.callback(os.chdir, here)
        try:
            with _stopped_at_the_start():
                code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except Started:
            code = None
        except BaseException as e:  # noqa: BLE001 (the property below names it)
            error = e
    return Outcome(argv, code, out.getvalue(), err.getvalue(), error)


def check(o: Outcome) -> None:
    """The property; raises AssertionError naming the line."""
    line = " ".join(o.argv)[:400]
    if o.error is not None:
        import traceback

        tb = "".join(traceback.format_exception(o.error))[-3000:]
        raise AssertionError(f"kvwatch {line}\n raised {type(o.error).__name__}: {tb}")
    assert "Traceback (most recent call last)" not in o.stderr, (
        f"kvwatch {line}\n{o.stderr[-2000:]}"
    )
    if o.code is None:
        return
    assert o.code in (0, 1, 2, 3), f"kvwatch {line}\n exit {o.code}: {o.stderr[-500:]}"
    if o.code in (2, 3):
        last = [x for x in o.stderr.splitlines() if x.strip()]
        assert last, f"kvwatch {line}\n exit {o.code} with nothing said"
        said = last[-1]
        assert said.startswith("kvwatch") and "error:" in said, f"kvwatch {line}\n{o.stderr[-800:]}"


def fuzz_one(words: tuple[str, ...], flags: list[Flag], fx: Fixtures, rng: random.Random,
             on_outcome: Callable[[Outcome], None] | None = None) -> Outcome:  # fmt: skip
    o = run_cli(argv_for(words, flags, fx, rng), cwd=fx.root / "cwd" / "a" / "b")
    if on_outcome is not None:
        on_outcome(o)
    check(o)
    return o
