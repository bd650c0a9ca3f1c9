"""The registry sweep (bench/bench_arch_sweep.py) in CI: the committed results cover every
text architecture of the vLLM in `.venv` with no wrong figure, and a rotating third of the
registry, swept again here (about 20 s), still lands in the classes committed.

A new vLLM release fails the first test until the bench is rerun and docs/sizing.md's table
updated; an arithmetic change that makes a family wrong fails the second within three days.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from arch_sweep import registry_architectures, sweep  # noqa: E402

pytestmark = pytest.mark.integration
RESULTS = json.loads((BENCH / "results" / "arch-sweep.json").read_text())
COMMITTED = {r["architecture"]: r for r in RESULTS["rows"]}


def test_the_committed_sweep_covers_this_vllm_and_is_never_wrong() -> None:
    import vllm

    assert RESULTS["vllm"] == vllm.__version__, "rerun bench/bench_arch_sweep.py for this vLLM"
    base = {name.split(" [")[0] for name in COMMITTED}
    assert base == set(registry_architectures())
    assert RESULTS["counts"]["WRONG"] == 0
    assert not [r for r in RESULTS["rows"] if r["cls"] == "WRONG"]
    # refusals are one short line, on both paths
    for r in RESULTS["rows"]:
        for said in (r["arithmetic"], r["vllm_path"]):
            if said.startswith("refused: "):
                assert len(said) - len("refused: ") < 200 and "\n" not in said, said


def test_a_rotating_third_of_the_registry_lands_as_committed() -> None:
    part = datetime.date.today().toordinal() % 3
    archs = sorted(registry_architectures())[part::3]
    _, rows = sweep(workers=2, only=archs)
    assert rows
    moved = [
        f"{r.architecture}: {COMMITTED[r.architecture]['cls']} -> {r.cls} ({r.detail})"
        for r in rows
        if COMMITTED.get(r.architecture, {}).get("cls") != r.cls
    ]
    assert not moved, "\n".join(moved)
    assert not [r for r in rows if r.cls == "WRONG"]
