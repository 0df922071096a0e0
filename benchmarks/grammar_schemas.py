"""JSON schemas for benchmarks/grammar_libraries.py: each with a valid instance and one that breaks it (so a
library that compiles a keyword but ignores it does not count as covering it)."""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat_object": {
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "valid": {"name": "Ada", "age": 36},
        "invalid": {"name": "Ada", "age": "36"},
    },
    "nested_object": {
        "schema": {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "address": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                            "required": ["city", "zip"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["id", "address"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        "valid": {"user": {"id": 7, "address": {"city": "Oslo", "zip": "0150"}}},
        "invalid": {"user": {"id": 7, "address": {"city": "Oslo"}}},
    },
    "array_of_numbers": {
        "schema": {"type": "array", "items": {"type": "number"}},
        "valid": [1.5, -2, 3e2],
        "invalid": [1.5, "two"],
    },
    "array_bounds": {
        "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
        "valid": [1, 2, 3],
        "invalid": [1, 2, 3, 4],
    },
    "enum": {
        "schema": {
            "type": "object",
            "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
            "required": ["label"],
            "additionalProperties": False,
        },
        "valid": {"label": "neutral"},
        "invalid": {"label": "mixed"},
    },
    "const": {
        "schema": {
            "type": "object",
            "properties": {"version": {"const": 2}},
            "required": ["version"],
            "additionalProperties": False,
        },
        "valid": {"version": 2},
        "invalid": {"version": 3},
    },
    "any_of": {
        "schema": {
            "anyOf": [
                {"type": "integer"},
                {
                    "type": "object",
                    "properties": {"x": {"type": "string"}},
                    "required": ["x"],
                    "additionalProperties": False,
                },
            ]
        },
        "valid": {"x": "y"},
        "invalid": {"x": 1},
    },
    "ref_defs": {
        "schema": {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "valid": {"a": {"x": 1, "y": 2}, "b": {"x": 0.5, "y": -1}},
        "invalid": {"a": {"x": 1}, "b": {"x": 0.5, "y": -1}},
    },
    "recursive_ref": {
        "schema": {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "integer"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["value", "children"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/node",
        },
        "valid": {"value": 1, "children": [{"value": 2, "children": []}]},
        "invalid": {"value": 1, "children": [{"value": "2", "children": []}]},
    },
    "pattern": {
        "schema": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
            "required": ["sku"],
            "additionalProperties": False,
        },
        "valid": {"sku": "ABC-1234"},
        "invalid": {"sku": "abc-1234"},
    },
    "format_date_time": {
        "schema": {
            "type": "object",
            "properties": {"when": {"type": "string", "format": "date-time"}},
            "required": ["when"],
            "additionalProperties": False,
        },
        "valid": {"when": "2026-11-28T08:30:00Z"},
        "invalid": {"when": "yesterday"},
    },
    "format_email_uuid": {
        "schema": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email"},
                "id": {"type": "string", "format": "uuid"},
            },
            "required": ["email", "id"],
            "additionalProperties": False,
        },
        "valid": {"email": "a@b.io", "id": "123e4567-e89b-12d3-a456-426614174000"},
        "invalid": {"email": "not an email", "id": "123"},
    },
    "number_bounds": {
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["score"],
            "additionalProperties": False,
        },
        "valid": {"score": 4},
        "invalid": {"score": 9},
    },
    "string_length": {
        "schema": {
            "type": "object",
            "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 4}},
            "required": ["code"],
            "additionalProperties": False,
        },
        "valid": {"code": "abc"},
        "invalid": {"code": "abcdef"},
    },
    "optional_properties": {
        "schema": {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "boolean"},
                "c": {"type": ["string", "null"]},
            },
            "required": ["a"],
            "additionalProperties": False,
        },
        "valid": {"a": 1, "c": None},
        "invalid": {"b": True},
    },
    "one_of": {
        "schema": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "boolean"}]},
        "valid": True,
        "invalid": 12,
    },
    "tool_call_shape": {
        "schema": {
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        "valid": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        "invalid": {"name": "get_weather", "arguments": {"unit": "kelvin"}},
    },
}
