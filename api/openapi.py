"""OpenAPI helpers for routes that read their body themselves (and so declare its schema by hand)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

DEFS_PREFIX = "#/$defs/"


def _inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(DEFS_PREFIX):
        name = ref[len(DEFS_PREFIX) :]
        if name in seen:
            raise ValueError(f"{name} is recursive: it cannot be inlined into a request body schema")
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**defs[name], **rest}, defs, (*seen, name))
    return {k: _inline(v, defs, seen) for k, v in node.items() if k != "$defs"}


def inline_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with every `#/$defs/...` reference replaced by its definition.

    pydantic's `$defs` references are relative to the model's own schema; pasted into the OpenAPI document
    (openapi_extra) they would point at `#/$defs` of the document, which does not exist.
    """
    schema = model.model_json_schema()
    return _inline(schema, schema.get("$defs", {}), ())


def json_request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring a required JSON body of this model's shape."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_json_schema(model)}},
        }
    }
