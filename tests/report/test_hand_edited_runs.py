"""Run files edited by hand, every field of every wrong type: `kvwatch report` draws what it
can and `kvwatch advise --run` advises or says why in one line; neither ever crashes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvwatch.common.cli_kit import CliError
from kvwatch.loadgen.results.run_observed import observed_from_dir
from kvwatch.sizing.advice import advise
from kvwatch.sizing.errors import SizingError
from tests.report.test_run_page import _run_dir, report

WRONG: list[Any] = ["x", None, [], {}, -1, True, 1e308, float("nan")]


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document, containers included."""
    if at:
        yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            yield from _paths(v, (*at, i))


def _set(doc: Any, at: tuple[Any, ...], value: Any) -> Any:
    if not at:
        return value
    doc = json.loads(json.dumps(doc))
    node = doc
    for k in at[:-1]:
        node = node[k]
    node[at[-1]] = value
    return doc


def _cases(base: Path) -> Iterator[tuple[str, tuple[Any, ...], Any]]:
    for name in ("spec.json", "summary.json"):
        doc = json.loads((base / name).read_text())
        for at in _paths(doc):
            for value in WRONG:
                yield name, at, value
    record = json.loads((base / "requests.jsonl").read_text().splitlines()[0])
    for at in _paths(record):
        for value in WRONG:
            yield "requests.jsonl", at, value


def test_no_field_of_any_type_crashes_report_or_advise(tmp_path: Path) -> None:
    base = _run_dir(tmp_path / "base")
    run = tmp_path / "edited"
    crashes = []
    n = 0
    for name, at, value in _cases(base):
        n += 1
        if run.exists():
            for f in run.iterdir():
                f.unlink()
        else:
            run.mkdir()
        for f in base.iterdir():
            (run / f.name).write_bytes(f.read_bytes())
        if name == "requests.jsonl":
            lines = (base / name).read_text().splitlines()
            lines[0] = json.dumps(_set(json.loads(lines[0]), at, value))
            (run / name).write_text("\n".join(lines) + "\n")
        else:
            doc = json.loads((base / name).read_text())
            (run / name).write_text(json.dumps(_set(doc, at, value)))
        for what in ("report", "advise"):
            try:
                if what == "report":
                    report(run)
                else:
                    observed, server = observed_from_dir(run)
                    advise(observed, 0.1, None, server)
            except (CliError, SizingError, ValueError) as e:
                assert "\n" not in str(e)
            except Exception as e:  # noqa: BLE001
                crashes.append(f"{what}: {name} {list(at)} = {value!r}: {type(e).__name__}: {e}")
    assert n > 300
    assert not crashes, f"{len(crashes)} of {2 * n}:\n" + "\n".join(crashes[:40])


def test_what_was_left_out_is_counted(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["overall"]["duration_s"] = "twelve"
    summary["server"]["preemptions"] = [12]
    (run / "summary.json").write_text(json.dumps(summary))
    assert "2 values of the wrong type in the run files" in report(run)
    notes = observed_from_dir(run)[0].notes
    assert "2 values of the wrong type in the run files were left out" in notes
