"""Which base model an adapter is bound to (issue 24 item 3), and the shape it is validated against.

The available base models are the catalog's live models plus the configured one (`settings.base_model_name`
at `settings.base_model_path`, the embedded default). An upload names its base with the `base_model` field;
without it, adapter_config.json's `base_model_name_or_path` is matched against every model's name and aliases
(case-insensitive); without a match, the only available model is taken, and with several the upload is refused
with the list. A new version keeps the base of its adapter. Shapes come from the catalog row; the relative
bounds on an adapter's update (registry/base_norms.py) use the norms the catalog recorded when the model was added
(or the local weights of the configured model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from registry.base_model_catalog import list_base_models
from registry.base_norms import norms_from_json
from registry.models import CatalogModel
from registry.validation import (
    CONFIG_FILENAME,
    AdapterInfo,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    validate_adapter_dir,
)
from settings import Settings

# validation codes that mean "trained for another base model" (the error then lists the bases that fit)
SHAPE_MISMATCH_CODES = ("wrong_base_model", "layer_out_of_range")
MAX_CONFIG_PEEK_BYTES = 64 * 1024


@dataclass(frozen=True)
class BaseModelChoice:
    """A base model an adapter may be bound to: its public name, the other names configs use, its shape."""

    name: str
    aliases: tuple[str, ...]
    spec: BaseModelSpec

    def is_named(self, name: str) -> bool:
        """True when `name` is this model's name or an alias (case-insensitive)."""
        folded = name.strip().casefold()
        return folded in {n.casefold() for n in (self.name, *self.aliases)}


def catalog_spec(model: CatalogModel) -> BaseModelSpec:
    """The linear-layer shape recorded for a catalog model."""
    shape = model.shape
    return BaseModelSpec(
        model_type=model.model_type,
        hidden_size=int(shape["hidden_size"]),
        intermediate_size=int(shape["intermediate_size"]),
        num_layers=int(shape["num_layers"]),
        num_heads=int(shape["num_heads"]),
        num_kv_heads=int(shape["num_kv_heads"]),
        head_dim=int(shape["head_dim"]),
        vocab_size=int(shape["vocab_size"]),
        stored_norms=norms_from_json(model.weight_norms),
    )


def available_base_models(
    session: Session, settings: Settings, local_spec: BaseModelSpec | None
) -> list[BaseModelChoice]:
    """The catalog's live models and the configured one (`local_spec`: its shape read from its directory, with
    the weights for the update bounds; None when no local model is configured), by name."""
    choices = {
        m.name: BaseModelChoice(m.name, tuple(m.aliases or ()), catalog_spec(m))
        for m in list_base_models(session)
    }
    configured = settings.base_model_name
    if local_spec is not None:
        aliases = choices[configured].aliases if configured in choices else ()
        choices[configured] = BaseModelChoice(configured, aliases, local_spec)
    return [choices[name] for name in sorted(choices)]


def names_of(choices: list[BaseModelChoice]) -> list[str]:
    """The public names of `choices`."""
    return [c.name for c in choices]


def find_base_model(choices: list[BaseModelChoice], name: str) -> BaseModelChoice | None:
    """The choice called `name` (or with that alias), if any."""
    return next((c for c in choices if c.is_named(name)), None)


def choose_base_model(
    choices: list[BaseModelChoice],
    *,
    requested: str | None,
    bound: str | None,
    config_base: str | None,
) -> BaseModelChoice:
    """The base model of an upload: the adapter's own (`bound`, a new version), else `requested` (the upload's
    `base_model` field), else the one `config_base` (adapter_config.json) names, else the only one."""
    available = names_of(choices)
    if not choices:
        raise AdapterValidationError(
            "no_base_model",
            "the platform serves no base model yet; an operator adds one with `lorahost models add`",
        )
    if requested is not None:
        chosen = find_base_model(choices, requested)
        if chosen is None:
            raise AdapterValidationError(
                "unknown_base_model", f"no base model {requested!r}; available base models: {available}"
            )
        if bound is not None and chosen.name != bound:
            raise AdapterValidationError(
                "base_model_mismatch",
                f"this adapter is bound to base model {bound!r}; its new versions must be for {bound!r} too "
                f"(upload an adapter for {chosen.name!r} under another name)",
            )
        return chosen
    if bound is not None:
        chosen = find_base_model(choices, bound)
        if chosen is None:
            raise AdapterValidationError(
                "unknown_base_model",
                f"this adapter's base model {bound!r} is no longer served; available base models: {available}",
            )
        return chosen
    if config_base:
        chosen = find_base_model(choices, config_base)
        if chosen is not None:
            return chosen
    if len(choices) == 1:
        return choices[0]
    named = (
        f"adapter_config.json names {config_base!r}, which is none of them" if config_base else "none named"
    )
    raise AdapterValidationError(
        "base_model_required",
        f"{named}: say which base model this adapter is for with the `base_model` field; available base models: "
        f"{available}",
    )


def peek_config_base(adapter_dir: Path) -> str | None:
    """adapter_config.json's `base_model_name_or_path`, or None when absent or unreadable (validation then
    reports what is wrong with the file)."""
    path = adapter_dir / CONFIG_FILENAME
    try:
        if path.stat().st_size > MAX_CONFIG_PEEK_BYTES:
            return None
        value = json.loads(path.read_bytes().decode("utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def validate_for_base(
    adapter_dir: Path, chosen: BaseModelChoice, choices: list[BaseModelChoice], limits: ValidationLimits
) -> AdapterInfo:
    """Validate the adapter against `chosen`; a shape mismatch names the available bases and those it fits."""
    try:
        return validate_adapter_dir(adapter_dir, chosen.spec, limits)
    except AdapterValidationError as exc:
        if exc.code not in SHAPE_MISMATCH_CODES:
            raise
        fitting = [c.name for c in choices if c.name != chosen.name and _fits(adapter_dir, c, limits)]
        hint = (
            f"it fits {fitting}: upload it with base_model={fitting[0]!r}"
            if fitting
            else "it fits none of them"
        )
        raise AdapterValidationError(
            exc.code,
            f"{exc.message} (base model {chosen.name!r}). Available base models: {names_of(choices)}; {hint}",
        ) from None


def _fits(adapter_dir: Path, choice: BaseModelChoice, limits: ValidationLimits) -> bool:
    try:
        validate_adapter_dir(adapter_dir, choice.spec, limits)
    except AdapterValidationError:
        return False
    return True
