"""`lorahost models add|list|remove` on an embedded data dir: the tiny model added from its directory, listed,
refused twice, removed; a bad source gets a message and exit code 2 with nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lorahost.cli import app


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_add_list_and_remove_a_model(base_model_dir: Path, tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    code, out = _run(
        "models",
        "add",
        "tiny-a",
        "--from",
        str(base_model_dir),
        "--engine",
        "native",
        "--engine",
        "vllm",
        *data,
    )
    assert code == 0, out
    assert "added tiny-a: llama, 2 layers, hidden 64" in out and "engines native, vllm" in out
    code, out = _run("models", "list", "--json", *data)
    [row] = [json.loads(line) for line in out.splitlines()]
    assert (row["name"], row["engines"], row["num_ready_adapters"]) == ("tiny-a", ["native", "vllm"], 0)
    code, out = _run("models", "add", "tiny-a", "--from", str(base_model_dir), *data)
    assert code == 2 and "already in the catalog" in out
    assert _run("models", "remove", "tiny-a", *data) == (0, "removed tiny-a\n")
    code, out = _run("models", "list", *data)
    assert code == 0 and "no base models in the catalog" in out
    assert any((tmp_path / "blobs" / "models" / "tiny-a").rglob("model.safetensors"))


def test_a_source_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    code, out = _run("models", "add", "x", "--from", str(tmp_path / "missing"), *data)
    assert code == 2 and "no such directory or file" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = _run("models", "add", "x", "--from", str(empty), *data)
    assert code == 2 and "no config.json" in out
    assert "no base models" in _run("models", "list", *data)[1]


def test_add_refuses_bad_names_and_aliases_before_importing_anything(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 33 item 6: `models add $'evil\\n'` created a blob folder named with a newline; aliases were not
    checked at all."""
    data = ["--data-dir", str(tmp_path)]
    source = ["--from", str(base_model_dir)]
    for args in (
        ["evil\n"],
        ["tiny-a", "--alias", "../../etc"],
        ["tiny-a", "--alias", "<img src=x onerror=alert(1)>"],
        ["tiny-a", "--alias", "org/ok", "--alias", "bad\n"],
    ):
        code, out = _run("models", "add", *args, *source, *data)
        assert code == 2 and "invalid base model" in out, out
    assert not (tmp_path / "blobs" / "models").exists()  # nothing stored under any name
    code, out = _run("models", "add", "tiny-a", "--alias", "org/Tiny", *source, *data)
    assert code == 0, out
    for alias in ("ORG/tiny", "tiny-a"):  # another model's alias (case-insensitive) or name
        code, out = _run("models", "add", "tiny-b", "--alias", alias, *source, *data)
        assert code == 2 and "of base model 'tiny-a'" in out, out
    code, out = _run("models", "add", "org", *source, *data)  # a name like an alias's first part is fine
    assert code == 0, out
