"""The house's structure: one namespace, no import circle, honest `__all__`, and commands that
load only what they use."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvwatch.common.command import EXTRA_OF_MODULE, missing_extra

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, from the package-dir mapping."""
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if any(p in ("node_modules", "typecheck") for p in rel) or (
                package == "kvwatch" and f"kvwatch.{rel[0]}" in PACKAGE_DIRS
            ):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Package modules this file imports, at any depth (lazy imports too), except those only
    a type checker reads."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in MODULES}
    return found


def test_layout_installs_as_one_namespace() -> None:
    assert set(PACKAGE_DIRS) == {
        "kvwatch", "kvwatch.sidecar", "kvwatch.loadgen", "kvwatch.dashboards", "kvwatch.alerts",
    }  # fmt: skip
    for name in ("kvwatch.sidecar", "kvwatch.loadgen", "kvwatch.alerts", "kvwatch.dashboards"):
        assert Path(importlib.import_module(name).__file__ or "").parent == ROOT / name[8:]


def test_no_import_circle() -> None:
    graph = {m: _imports(p) - {m} for m, p in MODULES.items()}
    assert graph["kvwatch.cli"], "the import reader sees imports"
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(m) :], m]))
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_the_circle_finder_finds_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from kvwatch.cli import main\n")
    b.write_text("import kvwatch.common.command\nif TYPE_CHECKING:\n    import kvwatch.cli\n")
    assert _imports(a) == {"kvwatch.cli"} and _imports(b) == {"kvwatch.common.command"}


def test_command_modules_never_import_the_top() -> None:
    from kvwatch.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        assert "kvwatch.cli" not in _imports(MODULES[name]), name


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"kvwatch.__main__"}))  # it runs main
def test_all_is_honest(name: str) -> None:
    """`__all__` lists names the module has, and every public function or class it defines."""
    module = importlib.import_module(name)
    listed = getattr(module, "__all__", None)
    assert isinstance(listed, list), f"{name} has no __all__ list"
    missing = [n for n in listed if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"
    assert len(listed) == len(set(listed)), f"{name}.__all__ repeats a name"
    tree = ast.parse(MODULES[name].read_text())
    defined = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
    ]
    unlisted = [n for n in defined if n not in listed]
    assert not unlisted, f"{name} defines public {unlisted} but leaves them out of __all__"


def test_listing_the_commands_loads_none_of_their_work() -> None:
    """`kvwatch --help` builds every parser; no heavy or optional library may load for it."""
    heavy = sorted({*EXTRA_OF_MODULE, "httpx", "yaml", "prometheus_client", "numpy", "sqlite3"})
    code = (
        "import sys; from kvwatch.cli import build_parser; build_parser(); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_missing_extra_names_the_install() -> None:
    err = missing_extra(ModuleNotFoundError("No module named 'pandas'", name="pandas"), "report")
    assert err is not None and err.code == 2
    assert str(err) == (
        "`kvwatch report` needs pandas, from the loadgen extra: pip install 'kvwatch[loadgen]'"
    )
    sdk = ModuleNotFoundError(name="grafana_foundation_sdk.builders")
    assert "kvwatch[dashboards]" in str(missing_extra(sdk, "dashboards"))
    assert missing_extra(ModuleNotFoundError(name="kvwatch.nothing"), "x") is None
