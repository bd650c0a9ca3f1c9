"""Every flag of every command, fuzzed from the argparse parsers themselves (tests/cli_fuzzing.py
holds the drawing and the property): exit 0-3 or the start of real work, one line for what is
refused, no traceback, no hang past the deadline. In CI, KVWATCH_FUZZ_CLI_EXAMPLES lines in
all (3,000), shared by the commands; bench/bench_fuzz_cli.py runs 10^4 a command."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_fuzzing import BASES, Fixtures, command_flags, fuzz_one
from tests.report.test_run_page import _run_dir

pytestmark = pytest.mark.fuzz
DATA = Path(__file__).resolve().parent / "data"
COMMANDS = command_flags()
PER_COMMAND = max(1, int(os.environ.get("KVWATCH_FUZZ_CLI_EXAMPLES", "3000")) // len(COMMANDS))


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Fixtures:
    root = tmp_path_factory.mktemp("cli-fuzz")
    traces = tuple(p for p in (DATA / "traces").iterdir() if p.suffix in (".csv", ".jsonl"))
    return Fixtures.make(root, _run_dir(root / "run"), DATA / "vllm-0.32-cpu-server.log", traces)


def test_every_command_has_a_base_line() -> None:
    """A command added without a base line would be fuzzed only at argparse's door."""
    assert set(COMMANDS) == set(BASES), set(COMMANDS) ^ set(BASES)


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
@settings(
    max_examples=PER_COMMAND, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_any_command_line_exits_cleanly(
    words: tuple[str, ...], rng: random.Random, fixtures: Fixtures
) -> None:
    fuzz_one(words, COMMANDS[words], fixtures, rng)
