"""Render the Helm chart offline and validate its manifests.

Rendering is Helm's own engine (Helm v4 Go SDK, in the PyPI wheel helm-python-sdk); Kubernetes objects are
validated by kubernetes-validate (the Kubernetes OpenAPI schemas as JSON schema, bundled in the PyPI package,
strict: unknown fields fail); KEDA objects by keda_v1alpha1.schema.json beside this file (KEDA's CRDs are
not in kubernetes-validate). Nothing here talks to a cluster.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import is_ci

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "lorahost"
KEDA_SCHEMA_PATH = Path(__file__).with_name("keda_v1alpha1.schema.json")
KUBERNETES_VERSIONS = ("1.29", "1.33")  # an older supported release and a recent one
RELEASE = "lorahost"
NAMESPACE = "lorahost"


def require(module: str) -> Any:
    """Import a validator; a missing one skips locally but fails under CI (it is a dev dependency)."""
    if is_ci():
        return __import__(module)
    return pytest.importorskip(module, reason=f"{module} missing: pip install -e '.[dev]'")


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders with `values` over its defaults, hooks included (helm template)."""
    helm = require("helm_python")
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(values or {})
        rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def validate(obj: dict[str, Any]) -> None:
    """Raise if `obj` is not a valid object of its kind (KEDA's, or Kubernetes' at each tested version)."""
    if obj["apiVersion"].startswith("keda.sh/"):
        validate_keda(obj)
        return
    kubernetes_validate = require("kubernetes_validate")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def validate_keda(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if `obj` breaks the vendored KEDA v1alpha1 schema of its kind."""
    import jsonschema

    schema = _keda_schema()
    if obj["kind"] not in schema["$defs"]:
        raise jsonschema.ValidationError(f"no vendored KEDA schema for kind {obj['kind']}")
    kind_schema = {"$ref": f"#/$defs/{obj['kind']}", "$defs": schema["$defs"]}
    jsonschema.Draft202012Validator(kind_schema).validate(obj)


@cache
def _keda_schema() -> dict[str, Any]:
    return json.loads(KEDA_SCHEMA_PATH.read_text())


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of `kind` called `name`."""
    matches = [obj for obj in by_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert len(matches) == 1, (
        f"expected one {kind} {name}, found {[o['metadata']['name'] for o in by_kind(objects, kind)]}"
    )
    return matches[0]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a Deployment's or Job's pod template."""
    return obj["spec"]["template"]["spec"]["containers"]
