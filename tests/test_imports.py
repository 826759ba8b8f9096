"""Dependencies run one way: no module of ``harness`` or ``paper_figs`` imports, even inside a
function, one that imports it back; and the library never imports ``paper_figs`` (the figures build
on the library, and reach the CLI through its plugin point, not the other way round).

A function-local import that only hides a circle shows up here as the circle it is. The scan reads
the source (``ast``), so it sees every import, taken or not.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "paper_figs")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The scanned modules an import statement in ``module`` loads: the module named, or the
    nearest scanned package above it (``import harness.sim.x`` where only ``harness.sim`` is known
    loads ``harness.sim``); ``from P import name`` loads the submodule ``P.name`` where there is one."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolved against the importing module's package
            package = module if is_package else module.rpartition(".")[0]
            parts = package.split(".")
            anchor = ".".join(parts[: len(parts) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    targets = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            targets.add(name)
    return targets


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the scanned modules it imports anywhere in its source (function bodies too), its
    own parent packages aside (importing ``harness.sim.x`` runs ``harness.sim``'s ``__init__``
    whatever it imports; that is not an edge a circle can be made of)."""
    paths = sorted(path for package in packages for path in (root / package).rglob("*.py"))
    modules = {_module_name(path, root) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        module = _module_name(path, root)
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, module, path.name == "__init__.py", modules)
        graph[module] = {target for target in edges if not module.startswith(f"{target}.") and target != module}
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
    assert {"harness.results.summary", "harness.results.trace", "harness.results.columns"} \
        <= graph["harness.results.records"]
    assert "harness.results.columns" in graph["harness.results.summary"]
    assert "harness.results.atomic" in graph["harness.results.columns"]
    assert any(target.startswith("harness.") for target in graph["paper_figs.experiments"])  # the figures' way down


def test_the_scan_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "harness" / "results"
    package.mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def later():\n    from harness.results.high import thing\n")
    (package / "high.py").write_text("from harness.results import low\n")
    cycle = find_cycle(import_graph(tmp_path, ("harness",)))
    assert cycle is not None and set(cycle) == {"harness.results.low", "harness.results.high"}


def test_no_module_imports_one_that_imports_it_back() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_library_never_imports_the_figures() -> None:
    graph = import_graph()
    back = {module: sorted(t for t in targets if t.split(".")[0] == "paper_figs")
            for module, targets in graph.items() if module.split(".")[0] == "harness"}
    assert not {module: targets for module, targets in back.items() if targets}
