"""Reading the twin's input files (profiles, planner workloads): JSON, or YAML by suffix, validated into a
pydantic model, every problem reported as one error naming the file and each field to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

YAML_SUFFIXES = (".yaml", ".yml")
ModelT = TypeVar("ModelT", bound=BaseModel)


def validate_file_content(
    model: type[ModelT], data: Any, origin: str, what: str, error: type[ValueError]
) -> ModelT:
    """`model` validated from `data`; `error` naming `origin` and each field (`what`: "twin profile", ...)."""
    if not isinstance(data, dict):
        raise error(f"{origin}: a {what} is a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise error(f"{origin}: invalid {what}: {problems}") from None


def read_file_content(path: Path, what: str, error: type[ValueError]) -> Any:
    """The parsed content of a JSON or YAML (by suffix) file; `error` when it cannot be read or parsed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    is_yaml = path.suffix in YAML_SUFFIXES
    try:
        return yaml_module(error).safe_load(text) if is_yaml else json.loads(text)
    except ValueError as exc:
        raise error(f"{path}: not valid JSON: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (yaml.YAMLError: PyYAML's own error class)
        raise error(f"{path}: not valid YAML: {exc}") from None


def yaml_module(error: type[ValueError]) -> Any:
    """PyYAML, or `error` saying how to get it."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with the project's environment
        raise error("YAML files need PyYAML (pip install pyyaml); or use a .json file") from None
    return yaml
