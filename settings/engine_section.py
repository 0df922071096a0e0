"""The base of the engine's concern classes (settings/engine.py): the section's flat names (engine_*) and
validation errors that name the field and its environment variable."""

from __future__ import annotations

from pydantic import BaseModel, ValidationInfo

from settings.section import env_name, section_config


class EngineSection(BaseModel):
    """What the engine's concern classes share: the section's flat names (engine_*) and its error messages."""

    model_config = section_config("engine_")

    @classmethod
    def _choice(cls, value: str, choices: tuple[str, ...], info: ValidationInfo) -> str:
        if value not in choices:
            raise ValueError(
                f"{info.field_name} must be one of {sorted(choices)}, got {value!r}: set {cls._env(info)} to one of "
                f"{', '.join(sorted(choices))}"
            )
        return value

    @classmethod
    def _positive(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"{info.field_name} must be positive, got {value} ({cls._env(info)})")
        return value

    @classmethod
    def _not_negative(cls, value: int, info: ValidationInfo) -> int:
        if value < 0:
            raise ValueError(
                f"{info.field_name} must be >= 0 (0 turns it off), got {value} ({cls._env(info)})"
            )
        return value

    @classmethod
    def _env(cls, info: ValidationInfo) -> str:
        """The environment variable of the field being validated."""
        field = cls.model_fields.get(str(info.field_name))
        return env_name(str(field.validation_alias)) if field else str(info.field_name)
