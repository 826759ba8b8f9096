"""harness.results is layered: no module imports, even inside a function, one that imports it back.

columns sits at the bottom, summary and trace on it, records (the run directory) on top. A
function-local import that only hides a circle (as records once did to reach summary and
trace) shows up here as the circle it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "harness.results"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "harness" / "results"


def _module_name(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules an import statement in ``module`` loads (its parent packages aside)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    base = node.module or ""
    if node.level:  # relative: resolved against the importing module's package
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        anchor = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    # ``from harness.results import atomic`` loads the submodule; any other name comes from base.
    targets = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return targets & modules


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (function bodies too)."""
    paths = sorted(package_dir.glob("*.py"))
    modules = {_module_name(path) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        module = _module_name(path)
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, module, path.name == "__init__.py", modules)
        graph[module] = edges - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target):], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_the_scan_sees_the_layers() -> None:
    graph = import_graph()
    assert {f"{PACKAGE}.summary", f"{PACKAGE}.trace", f"{PACKAGE}.columns"} <= graph[f"{PACKAGE}.records"]
    assert f"{PACKAGE}.columns" in graph[f"{PACKAGE}.summary"]
    assert f"{PACKAGE}.atomic" in graph[f"{PACKAGE}.columns"]


def test_the_scan_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "low.py").write_text("def later():\n    from harness.results.high import thing\n")
    (tmp_path / "high.py").write_text("from harness.results import low\n")
    cycle = find_cycle(import_graph(tmp_path))
    assert cycle is not None and set(cycle) == {f"{PACKAGE}.low", f"{PACKAGE}.high"}


def test_no_module_of_harness_results_imports_one_above_it() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle in harness.results: " + " -> ".join(cycle)
