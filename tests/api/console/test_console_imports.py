"""The console calls the action layer (api/actions/), never a REST route function (also an import-linter
contract in pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import api.console

CONSOLE_DIR = Path(api.console.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_no_console_module_imports_a_route_module() -> None:
    offending = {
        path.name: sorted(
            m for m in _imported_modules(path) if m == "api.routes" or m.startswith("api.routes.")
        )
        for path in sorted(CONSOLE_DIR.glob("*.py"))
    }
    assert {name: mods for name, mods in offending.items() if mods} == {}
