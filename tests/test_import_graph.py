"""No import circles between the project's modules.

The graph is read from the source with `ast`, so it sees every import a module can execute: module-level and
function-level alike. Imports under `if TYPE_CHECKING:` never run and do not count. `from pkg import name`
is an edge to `pkg.name` when that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "api",
    "registry",
    "cluster",
    "scheduler",
    "gpu_workers",
    "jobs",
    "lorahost",
    "migrations",
    "settings",
    "twin",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "versions" not in path.relative_to(ROOT).parts:
                files[_module_name(path)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all nesting levels, minus the body of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _resolve_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _owning_module(name: str, modules: set[str]) -> str | None:
    """The longest prefix of `name` that is one of our modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _edges(module: str, path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _runtime_imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _resolve_base(node, module, is_package)
            names = [base if f"{base}.{a.name}" not in modules else f"{base}.{a.name}" for a in node.names]
        targets.update(t for t in (_owning_module(name, modules) for name in names) if t is not None)
    targets.discard(module)
    return targets


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports at run time."""
    files = _source_files()
    modules = set(files)
    return {module: _edges(module, path, modules) for module, path in files.items()}


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                child = pending.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, for a readable failure message."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    next_frontier.append(child)
        frontier = next_frontier
    return component


def test_graph_sees_function_level_imports_and_skips_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "def f():\n    import c\n"
    )
    names = sorted(alias.name for node in _runtime_imports(tree) for alias in node.names)
    assert names == ["TYPE_CHECKING", "b", "c"]


def test_cycle_finder_reports_a_circle_and_ignores_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert _shortest_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    graph = import_graph()
    components = _strongly_connected(graph)
    report = [
        f"{' -> '.join(_shortest_cycle(graph, component))}  (all {len(component)}: {', '.join(component)})"
        for component in components
    ]
    for line in report:
        print(line)
    assert not report, "import circles:\n" + "\n".join(report)
