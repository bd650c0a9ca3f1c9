"""The CLI fuzzer at 10^4 command lines a command (CI runs 3,000 in all): every flag of every
command, drawn from the argparse parsers (tests/cli_fuzzing.py, the same property as
tests/test_fuzz_cli.py). Prints each command's exit codes and every distinct failure, and
writes bench/results/fuzz-cli.json.

    PYTHONPATH=. .venv/bin/python bench/bench_fuzz_cli.py [--cases 10000] [--seed 1] [COMMAND ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.cli_fuzzing import Fixtures, command_flags, fuzz_one
from tests.report.test_run_page import _run_dir

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
OUT = Path(__file__).resolve().parent / "results" / "fuzz-cli.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="command lines per command")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("commands", nargs="*", help="only these (e.g. 'loadgen run'); default all")
    ns = ap.parse_args()
    commands = command_flags()
    results = {}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        traces = tuple(p for p in (DATA / "traces").iterdir() if p.suffix in (".csv", ".jsonl"))
        fx = Fixtures.make(root, _run_dir(root / "run"), DATA / "vllm-0.32-cpu-server.log", traces)
        for words, flags in commands.items():
            name = " ".join(words)
            if ns.commands and name not in ns.commands:
                continue
            rng = random.Random(f"{ns.seed}:{name}")
            codes: collections.Counter[str] = collections.Counter()
            failures: dict[str, str] = {}
            t0 = time.perf_counter()
            for i in range(ns.cases):
                try:
                    o = fuzz_one(words, flags, fx, rng)
                    codes["started" if o.code is None else str(o.code)] += 1
                except AssertionError as e:
                    text = str(e)
                    key = text.splitlines()[-1][:160]
                    codes["FAILED"] += 1
                    failures.setdefault(key, text[:1500])
                if (i + 1) % 1000 == 0:
                    print(f"  {name}: {i + 1:,} ...", file=sys.stderr, flush=True)
            took = time.perf_counter() - t0
            failed += codes["FAILED"]
            results[name] = {"cases": ns.cases, "outcomes": dict(codes), "seconds": round(took, 1),
                             "failures": list(failures.values())}  # fmt: skip
            print(f"{name:22} {ns.cases:>7,} lines {took:7.1f} s  {dict(sorted(codes.items()))}",
                  flush=True)  # fmt: skip
            for text in failures.values():
                print("   FAILED:", text[:600])
    doc = {"cases_per_command": ns.cases, "seed": ns.seed, "commands": results,
           "failures": failed}  # fmt: skip
    if not ns.commands:
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
