"""The house's structure: one namespace, rooms whose imports only go down, no import circle,
honest `__all__`, a wheel that holds every module, and commands that load only what they use.

The order of the rooms, top of the house to the ground, is `FLOORS`; docs/architecture.md shows
the same list (a test holds the two together). A module may import its own room and any room on
a lower floor, never a room on its own floor or above. alerts/ and dashboards/ read the sidecar
only through its shared contract."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvwatch.common.cli_kit import EXTRA_OF_MODULE, missing_extra

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]

# Top of the house first. Rooms on one floor may not import each other.
FLOORS: list[list[str]] = [
    ["kvwatch"],
    ["kvwatch.fleet"],
    ["kvwatch.advise", "kvwatch.report", "kvwatch.twin"],
    ["kvwatch.loadgen", "kvwatch.alerts", "kvwatch.dashboards"],
    ["kvwatch.loadgen.send"],
    ["kvwatch.loadgen.workload", "kvwatch.loadgen.results"],
    ["kvwatch.sidecar"],
    ["kvwatch.sidecar.outputs"],
    ["kvwatch.sidecar.state"],
    ["kvwatch.sidecar.store"],
    ["kvwatch.sidecar.judge"],
    ["kvwatch.sidecar.logs"],
    ["kvwatch.sidecar.kvevents"],
    ["kvwatch.sidecar.metrics"],
    ["kvwatch.sidecar.contract"],
    ["kvwatch.timing"],
    ["kvwatch.sizing"],
    ["kvwatch.local", "kvwatch.common"],
]
FLOOR_OF = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
# What alerts/ and dashboards/ may read of the sidecar: the names and thresholds they share.
CONTRACT = "kvwatch.sidecar.contract"


def _package_folders() -> dict[str, Path]:
    """Every package of the installed tree, by dotted name: the package-dir mapping, walked."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).parts
            if any(p in ("node_modules", "typecheck", "__pycache__") for p in rel):
                continue
            if package == "kvwatch" and rel and f"kvwatch.{rel[0]}" in PACKAGE_DIRS:
                continue  # a folder of its own in the mapping (kvwatch.sidecar is sidecar/)
            out[".".join([package, *rel])] = init.parent
    return out


PACKAGES = _package_folders()


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


MODULES = _modules()
_HANDLER = re.compile(r"^(kvwatch(?:\.\w+)+):\w+$")


def _imports(path: Path) -> set[str]:
    """Package modules this file imports, at any depth (lazy imports too, and the
    "module:function" targets of lazy command handlers), except those only a type checker
    reads."""
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = _HANDLER.match(node.value)
            names = [m.group(1)] if m else []
        else:
            continue
        found |= {n for n in names if n in MODULES}
    return found


def room_of(module: str) -> str:
    """The room a module lives in: the longest room name it starts with."""
    rooms = [r for r in FLOOR_OF if module == r or module.startswith(r + ".")]
    assert rooms, f"{module} is in no room: add its package to FLOORS"
    return max(rooms, key=len)


def wrong_imports(module: str, imported: set[str]) -> list[str]:
    """Each import of `module` that breaks the house's rule, said in words."""
    here = room_of(module)
    out = []
    for target in sorted(imported):
        there = room_of(target)
        if there == here:
            continue
        if FLOOR_OF[there] <= FLOOR_OF[here]:
            out.append(f"{module} ({here}) imports {target} ({there}), which is not below it")
        elif (
            here in ("kvwatch.alerts", "kvwatch.dashboards")
            and there.startswith("kvwatch.sidecar")
            and there != CONTRACT
        ):
            out.append(f"{module} reads the sidecar's internals ({target}), not its contract")
    return out


def test_every_package_is_in_a_room_and_in_the_wheel() -> None:
    """A new subpackage must be placed on a floor and listed for setuptools, which would
    otherwise leave it out of the wheel without a word."""
    assert sorted(SETUPTOOLS["packages"]) == sorted(PACKAGES)
    for name in PACKAGES:
        room_of(name)
    for folder in PACKAGE_DIRS.values():
        for py in (ROOT / folder).rglob("*.py"):
            if "node_modules" in py.parts or "typecheck" in py.parts:
                continue
            assert (py.parent / "__init__.py").exists(), f"{py} is in a folder with no __init__.py"


def test_imports_only_go_down() -> None:
    wrong = [w for m, p in MODULES.items() for w in wrong_imports(m, _imports(p))]
    assert not wrong, "\n".join(wrong)


def test_the_house_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """A deliberate upward import, lazy, and a dashboard reading a judge module: both caught."""
    low = tmp_path / "low.py"
    low.write_text("def f():\n    from kvwatch.sidecar.daemon import serve_sidecar\n")
    assert wrong_imports("kvwatch.sidecar.contract.new", _imports(low)) == [
        "kvwatch.sidecar.contract.new (kvwatch.sidecar.contract) imports kvwatch.sidecar.daemon "
        "(kvwatch.sidecar), which is not below it"
    ]
    dash = tmp_path / "dash.py"
    dash.write_text("from kvwatch.sidecar.judge.detect import judge\n")
    assert wrong_imports("kvwatch.dashboards.new", _imports(dash)) == [
        "kvwatch.dashboards.new reads the sidecar's internals (kvwatch.sidecar.judge.detect), "
        "not its contract"
    ]
    peer = tmp_path / "peer.py"
    peer.write_text('X = "kvwatch.report.run_page:run_report"\n')
    assert len(wrong_imports("kvwatch.advise.new", _imports(peer))) == 1


def test_docs_show_the_rooms_in_this_order() -> None:
    """docs/architecture.md lists the floors as this test holds them."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("<!-- floors -->")[1]
    listed = re.findall(r"^\s*\d+\.\s+(.+)$", section, flags=re.M)
    # the rooms are the names before the first colon, asides in parentheses left out
    shown = [re.findall(r"`([\w/]+)`", re.sub(r"\([^)]*\)", "", ln).split(":")[0]) for ln in listed]
    expected = [[r.replace("kvwatch.", "", 1).replace(".", "/") if r != "kvwatch" else "kvwatch"
                 for r in rooms] for rooms in FLOORS]  # fmt: skip
    assert shown == expected


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
    b.write_text("import kvwatch.common.cli_kit\nif TYPE_CHECKING:\n    import kvwatch.cli\n")
    assert _imports(a) == {"kvwatch.cli"} and _imports(b) == {"kvwatch.common.cli_kit"}


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


def test_a_command_loads_no_httpx_command_line() -> None:
    """httpx imports its own CLI (rich, pygments, click) where they are installed, as they are
    here beside vLLM: 6 MB of a sidecar's memory (#45). A command's process keeps it out."""
    code = (
        "import sys\nfrom kvwatch.cli import main\ntry: main(['--version'])\n"
        "except SystemExit: pass\nimport httpx, kvwatch.sidecar.daemon\n"
        "print(sorted(m for m in ('rich', 'pygments', 'click') if m in sys.modules), "
        "callable(httpx.main))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("\n[] True"), out.stdout


def test_a_missing_extra_names_the_install() -> None:
    err = missing_extra(ModuleNotFoundError("No module named 'pandas'", name="pandas"), "report")
    assert err is not None and err.code == 2
    assert str(err) == (
        "`kvwatch report` needs pandas, from the loadgen extra: pip install 'kvwatch[loadgen]'"
    )
    sdk = ModuleNotFoundError(name="grafana_foundation_sdk.builders")
    assert "kvwatch[dashboards]" in str(missing_extra(sdk, "dashboards"))
    assert missing_extra(ModuleNotFoundError(name="kvwatch.nothing"), "x") is None


def test_every_command_module_names_its_handlers_as_strings() -> None:
    """One kind of handler: each `set_defaults(func=...)` in a room's command.py is
    `handler("module:function")`, a `run_*` function that exists (imported here, as it would be
    when its command runs)."""
    from kvwatch.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        assert name.endswith(".command"), f"{name}: a room's parser is its command.py"
        tree = ast.parse(MODULES[name].read_text())
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "set_defaults"
        ]
        assert calls, f"{name} registers no handler"
        for call in calls:
            func = next(k.value for k in call.keywords if k.arg == "func")
            assert isinstance(func, ast.Call) and ast.unparse(func.func) == "handler", (
                f"{name}: {ast.unparse(func)} is not handler('module:function')"
            )
            target = func.args[0]
            assert isinstance(target, ast.Constant) and isinstance(target.value, str)
            module, _, function = target.value.partition(":")
            assert function.startswith("run_"), f"{name}: handler {target.value} is not run_*"
            assert callable(getattr(importlib.import_module(module), function))


# Rooms that say they are pure (figures in, figures out) and the I/O they may not import.
PURE_ROOMS = ("kvwatch.sizing", "kvwatch.timing", "kvwatch.sidecar.judge")
IO_MODULES = frozenset(
    {"socket", "sqlite3", "httpx", "subprocess", "threading", "asyncio", "multiprocessing",
     "urllib.request", "http.client", "http.server", "selectors", "ssl"}
)  # fmt: skip


def io_imports(path: Path) -> set[str]:
    """The I/O libraries a file imports at any depth (lazy ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & IO_MODULES
    return found


@pytest.mark.parametrize("room", PURE_ROOMS)
def test_pure_rooms_import_no_io(room: str) -> None:
    """sizing, timing and judge are arithmetic on typed values: what reads a socket, a database or a
    child process lives in a room that says so (kvwatch/local runs vLLM's spec builder)."""
    wrong = {
        m: sorted(io_imports(p)) for m, p in MODULES.items() if room_of(m) == room and io_imports(p)
    }
    assert not wrong, wrong


def test_the_purity_check_finds_io(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import json\ndef f():\n    import subprocess\n    from http.client import X\n")
    assert io_imports(bad) == {"subprocess", "http.client"}
