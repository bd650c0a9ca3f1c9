"""Fuzzing with hypothesis, in CI: mutated real vLLM metrics, log lines, and byte streams cut
anywhere. 10^4 cases per target (KVWATCH_FUZZ_EXAMPLES changes it); bench/bench_fuzz.py runs
10^5 with plain random mutations. Marked `fuzz` (`-m "not fuzz"` leaves them out)."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import (
    LOG_LINES,
    METRIC_LINES,
    check_exposition,
    check_log_line,
    check_splitter,
    mutate,
)

pytestmark = pytest.mark.fuzz
EXAMPLES = int(os.environ.get("KVWATCH_FUZZ_EXAMPLES", "10000"))
_FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_FUZZ
@given(st.randoms(use_true_random=False), st.integers(1, 40))
def test_mutated_metrics_never_crash_or_export_untruth(rng: random.Random, n: int) -> None:
    lines = rng.sample(METRIC_LINES, min(n, len(METRIC_LINES)))
    check_exposition([mutate(line, rng) if rng.random() < 0.5 else line for line in lines])


@_FUZZ
@given(st.randoms(use_true_random=False))
def test_mutated_log_lines_never_crash_or_say_the_impossible(rng: random.Random) -> None:
    check_log_line(mutate(rng.choice(LOG_LINES), rng))


@_FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_the_line_splitter_reassembles_any_chunking(data: bytes, cuts: list[int]) -> None:
    check_splitter(data, cuts)
