"""What every settings section shares: its model config, its flat environment names and named-choice checks.

A section's fields have short names (`engine.num_threads`); each keeps the flat name it had when all settings
sat in one class (`engine_num_threads`, read from LORAHOST_ENGINE_NUM_THREADS). The flat name is the field's
validation alias: the section prefix plus the field name, unless the field declares its own alias.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import AliasGenerator, BaseModel, ConfigDict

ENV_PREFIX = "LORAHOST_"


def section_config(prefix: str) -> ConfigDict:
    """The model config of a section whose flat names are `prefix` + field name (frozen, unknown keys refused,
    built by field name or by flat name)."""
    return ConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        alias_generator=AliasGenerator(validation_alias=lambda name: prefix + name),
    )


def flat_names(section: type[BaseModel]) -> dict[str, str]:
    """Flat name (the environment name without LORAHOST_, lower case) -> field name, for one section."""
    return {str(info.validation_alias or name): name for name, info in section.model_fields.items()}


def env_name(flat_name: str) -> str:
    """The environment variable of a flat setting name."""
    return ENV_PREFIX + flat_name.upper()


def named_choice(value: str, choices: Collection[str], what: str, env: str | None = None) -> str:
    """`value` when it names one of `choices`; else a ValueError that lists the choices (and, given `env`, says
    which variable to set to one of them)."""
    if value not in choices:
        names = ", ".join(sorted(choices))
        fix = f": set {env} to one of {names}" if env else f"; choose one of {names}"
        raise ValueError(f"unknown {what} {value!r}{fix}")
    return value
