"""The packages stack one way: the import graph has no arrow from a lower layer up.

    kernel  <-  recorder, engine  <-  proxy  <-  trainer_bridge  <-  loop  <-  cli
    kernel  <-  sandbox  <-  tasks  <-  rollouts                 <-  loop  <-  cli
    recorder, trainer_bridge, rollouts  <-  verl_bridge  (imported by verl, by nothing here)
                                                  bench  <-  tests (above everything)

The rollout side talks to the proxy only over HTTP, so it imports nothing of the proxy,
the recorder or the engine; the loop drives both sides, and reaches the proxy over HTTP too.

Every import statement in the tree is read (module level and inside functions), so a
wrong-way import fails here whatever path it hides on. Two more rules keep the boundaries
honest: only the recorder runs SQL (nothing above it imports ``sqlalchemy`` or the
recorder's schema; the command line may parse a database URL), and no module imports
another module's private (underscored) names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "kernel",
    "recorder",
    "engine",
    "proxy",
    "trainer_bridge",
    "sandbox",
    "tasks",
    "rollouts",
    "loop",
    "verl_bridge",
    "cli",
    "bench",
    "tests",
)
# verl_bridge is verl's to import: nothing of lego-proxy's own (the command line included) does.
EVERYTHING = frozenset(PACKAGES) - {"bench", "tests", "verl_bridge"}
# What each package may import of the project, besides itself.
ALLOWED: dict[str, frozenset[str]] = {
    "kernel": frozenset(),
    "recorder": frozenset({"kernel"}),
    "engine": frozenset({"kernel"}),
    "proxy": frozenset({"kernel", "recorder"}),
    "trainer_bridge": frozenset({"kernel", "recorder"}),
    "sandbox": frozenset({"kernel"}),
    "tasks": frozenset({"kernel", "sandbox"}),
    "rollouts": frozenset({"kernel", "sandbox", "tasks"}),
    "loop": frozenset({"kernel", "recorder", "trainer_bridge", "sandbox", "tasks", "rollouts"}),
    "verl_bridge": frozenset(
        {"kernel", "recorder", "trainer_bridge", "sandbox", "tasks", "rollouts"}
    ),
    "cli": EVERYTHING - {"cli"},
    "bench": EVERYTHING,
    # The tests mirror every package, the benchmarks' helpers included.
    "tests": EVERYTHING | {"verl_bridge", "bench"},
}
# Only the recorder speaks SQL; these packages may not import it at all.
NO_SQL = (
    "kernel",
    "engine",
    "proxy",
    "trainer_bridge",
    "sandbox",
    "tasks",
    "rollouts",
    "loop",
    "verl_bridge",
)
SQL_MODULES = ("sqlalchemy", "recorder.schema")


def _imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) of every import in ``path``; relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            yield node.lineno, module, tuple(alias.name for alias in node.names)


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down(package: str) -> None:
    wrong = []
    for path in _sources(package):
        for line, module, _ in _imports(path):
            top = module.split(".")[0]
            if top in PACKAGES and top != package and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


@pytest.mark.parametrize("package", NO_SQL)
def test_only_the_recorder_runs_sql(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(package)
        for line, module, _ in _imports(path)
        if any(module == m or module.startswith(f"{m}.") for m in SQL_MODULES)
    ]
    assert wrong == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_private_names_of_another(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {module}"
        for path in _sources(package)
        for line, module, names in _imports(path)
        if module.split(".")[0] in PACKAGES
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert wrong == []


def test_the_rules_catch_a_wrong_way_import(tmp_path: Path) -> None:
    """The reader sees the imports these rules judge, function-level and relative ones too."""
    module = tmp_path / "recorder" / "probe.py"
    module.parent.mkdir()
    module.write_text(
        "def f():\n    from proxy.metrics import Metrics\n    from .store import _x\n"
        "    import sqlalchemy.orm\n"
    )
    assert list(_imports(module, tmp_path)) == [
        (2, "proxy.metrics", ("Metrics",)),
        (3, "recorder.store", ("_x",)),
        (4, "sqlalchemy.orm", ()),
    ]
