"""House rule (issue 21): no module of the project over MAX_MODULE_LINES lines outside benchmarks/ and
migrations/; a module that grows past it is split along a seam."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
EXEMPT = ("benchmarks", "migrations")
PACKAGES = (
    "api",
    "cluster",
    "gpu_workers",
    "jobs",
    "lorahost",
    "registry",
    "scheduler",
    "settings",
    "tests",
    "twin",
)


def _num_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_no_module_is_over_the_line_limit() -> None:
    over = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not set(path.relative_to(ROOT).parts) & set(EXEMPT) and (n := _num_lines(path)) > MAX_MODULE_LINES
    }
    assert over == {}, f"split these along a seam (limit {MAX_MODULE_LINES} lines): {over}"


def test_the_line_count_sees_a_long_file(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert _num_lines(long) == MAX_MODULE_LINES + 1
