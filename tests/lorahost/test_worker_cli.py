"""`lorahost worker --engine`: the engine behind the worker is chosen on the command line (issue 23's contract),
and a name that is not an engine is refused with the choices before anything starts."""

from __future__ import annotations

from typer.testing import CliRunner

from lorahost.cli import app


def test_an_unknown_engine_is_refused_with_the_choices() -> None:
    result = CliRunner().invoke(app, ["worker", "--engine", "tgi"], env={"LORAHOST_INTERNAL_TOKEN": "t"})
    assert result.exit_code == 2
    assert "backend must be one of ['native', 'vllm']" in result.output


def test_the_engine_flag_is_documented() -> None:
    result = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert "--engine" in result.output and "native or vllm" in result.output
