"""The docs name paths that exist (issue 34): docs/architecture.md's table of mechanisms, the other docs and the
READMEs point at modules and packages of the tree, so a move or rename that forgets them fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = (
    "README.md",
    "benchmarks/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
)
TOP = "api|registry|cluster|scheduler|gpu_workers|jobs|lorahost|settings|twin|benchmarks|tests"
# a repo-relative module (`scheduler/routing/router.py`) or package (`scheduler/routing/`), not part of a longer path
PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/(?:[A-Za-z0-9_]+/)*(?:[A-Za-z0-9_]+\.py)?)(?![\w/])")


def _named_paths(doc: str) -> set[str]:
    return set(PATH.findall((ROOT / doc).read_text()))


def test_architecture_table_names_the_mechanism_packages() -> None:
    named = _named_paths("docs/architecture.md")
    for package in ("admission", "multiqueue", "length", "routing", "placement", "scaling", "cache", "core"):
        assert f"`{package}/`" in (ROOT / "docs/architecture.md").read_text(), package
        assert (ROOT / "scheduler" / package / "__init__.py").is_file(), package
    assert "scheduler/routing/caraserve_router.py" in named


def test_every_path_the_docs_name_exists() -> None:
    named = [(doc, path) for doc in DOCS for path in sorted(_named_paths(doc))]
    # folders under benchmarks/ are run outputs (benchmarks/results/), not part of the tree
    missing = [
        f"{doc}: {p}" for doc, p in named if not (ROOT / p).exists() and not p.startswith("benchmarks/")
    ]
    assert not missing, missing
