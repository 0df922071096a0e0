"""The flat LORAHOST_* names of the sectioned settings: reading them from the environment and routing flat
constructor keywords (`engine_num_threads=2`) into their section.

A flat name belongs to one place: a top-level field of Settings (its own name) or a section field (its
validation alias, settings/section.py). Environment names are matched without regard to case, as before.
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from settings.section import env_name, flat_names

_JSON_ORIGINS = (dict, list)  # decoded from JSON text, as pydantic-settings does for complex fields


def sections(settings_cls: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Section attribute -> section model, for the fields of `settings_cls` that are sections."""
    found = {}
    for name, info in settings_cls.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found[name] = info.annotation
    return found


def flat_fields(settings_cls: type[BaseModel]) -> dict[str, tuple[str | None, FieldInfo]]:
    """Every flat name -> (its section attribute, or None at the top level; its field)."""
    out: dict[str, tuple[str | None, FieldInfo]] = {}
    section_models = sections(settings_cls)
    for name, info in settings_cls.model_fields.items():
        if name not in section_models:
            out[name] = (None, info)
    for attr, model in section_models.items():
        for flat, field_name in flat_names(model).items():
            out[flat] = (attr, model.model_fields[field_name])
    return out


def nest_flat(settings_cls: type[BaseModel], values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every flat section name moved into its section's dict (keyed by flat name); a section
    passed whole (a dict by field or flat name, or a model) is kept, and flat names for it are refused."""
    fields = flat_fields(settings_cls)
    nested: dict[str, Any] = {}
    for key, value in values.items():
        section = fields.get(key, (None, None))[0]
        if section is None:
            nested[key] = value
            continue
        target = nested.setdefault(section, {})
        if not isinstance(target, dict):
            raise TypeError(f"{key} given beside the whole {section} section: pass one or the other")
        target[key] = value
    return nested


def flat_values(settings: BaseModel) -> dict[str, Any]:
    """Every flat name -> its current value, for the settings object `settings` (the inverse of nest_flat)."""
    values = {}
    for flat, (section, _) in flat_fields(type(settings)).items():
        holder = settings if section is None else getattr(settings, section)
        name = flat if section is None else flat_names(type(holder))[flat]
        values[flat] = getattr(holder, name)
    return values


def env_text(value: Any) -> str:
    """A setting's value as environment text that reads back to it (JSON for mappings, commas for tuples)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


class FlatEnvSource(PydanticBaseSettingsSource):
    """Reads LORAHOST_<FLAT NAME> for every flat name of the settings class, nested into sections."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: __call__ reads every name at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {key.lower(): value for key, value in os.environ.items()}
        values = {}
        for flat, (_, info) in flat_fields(self.settings_cls).items():
            raw = environ.get(env_name(flat).lower())
            if raw is not None:
                values[flat] = _decode(flat, raw, info)
        return nest_flat(self.settings_cls, values)


def _decode(flat: str, raw: str, info: FieldInfo) -> Any:
    """The environment text of one setting: JSON for mapping and list fields, else the text (pydantic converts)."""
    if not _is_json_field(info.annotation):
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{env_name(flat)} must be JSON: {exc}") from exc


def _is_json_field(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_json_field(arg) for arg in typing.get_args(annotation))
    return origin in _JSON_ORIGINS or annotation in _JSON_ORIGINS


def flat_env_sources(
    settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource
) -> tuple[PydanticBaseSettingsSource, ...]:
    """Constructor keywords first, then the flat environment names (no .env file, no secrets directory)."""
    return init_settings, FlatEnvSource(settings_cls)
