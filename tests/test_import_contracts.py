"""The import-linter contracts in pyproject.toml hold with no exemptions (issue 34): a module that needs what its
package may not import gets it injected by a composition root above it (the worker's blob store: a `BlobSource`
from the `lorahost` commands), or lives in tests/ when only tests use it (tests/worker_harness.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_contract_has_exemptions() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    exempted = {c["name"]: c["ignore_imports"] for c in contracts if c.get("ignore_imports")}
    assert contracts and exempted == {}, f"inject the dependency instead of exempting the import: {exempted}"
