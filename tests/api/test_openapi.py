"""The OpenAPI document: every `$ref` resolves inside /openapi.json (schemathesis and client generators
follow them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref} is not a local reference"
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve (no {part!r})"
        node = node[part]
    return node


def test_every_ref_in_the_openapi_document_resolves(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    refs = sorted(set(_refs(document)))
    assert refs, "expected component references"
    for ref in refs:
        _resolve(document, ref)


def test_inference_request_bodies_are_documented(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/adapters/{name}/completions"):
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        resolved = _resolve(document, schema["$ref"]) if "$ref" in schema else schema
        assert "model" in resolved["properties"] and "stream_options" in resolved["properties"]
