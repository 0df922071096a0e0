"""The base-model catalog (issue 24): add a model's files to the blob store and record it, list, look up, remove.

A model is a Hugging Face directory (config.json of a supported Llama-family type, safetensors weights, the
tokenizer files). `add_base_model` checks its config, digests every file, stores each under a content-addressed
key (`models/<name>/<sha256>/<file>`: a worker verifies what it fetches against the recorded digest), writes the
manifest workers read by name (registry/base_model_manifest.py), and records the row only once every file is
stored, so a failed add leaves no catalog entry. Names and aliases follow one rule and are unique across the
catalog, removed models included (registry/model_names.py: table base_model_names). Removing a model with ready
adapters bound to it is refused unless forced; a removed model keeps its row (usage history names it).
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.base_model_manifest import ModelFile, dump_manifest, file_key, manifest_key
from registry.base_norms import base_weight_norms, norms_to_json
from registry.digests import sha256_file
from registry.errors import ConflictError, InvalidRequestError, NotFoundError
from registry.model_names import (
    check_model_name,
    check_names_free,
    check_no_adapter_named,
    find_name,
    model_aliases,
    reserve_names,
)
from registry.models import Adapter, AdapterVersion, CatalogModel, utcnow
from registry.storage import BlobStore
from registry.validation import AdapterValidationError, BaseModelSpec

ENGINES = ("native", "vllm")
# the files of a model directory that belong to the model (weights, config, tokenizer, chat template)
MODEL_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


def model_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` that make up the model (sorted, no duplicates)."""
    found = {p for pattern in MODEL_FILE_PATTERNS for p in Path(model_dir).glob(pattern) if p.is_file()}
    return sorted(found)


def add_base_model(
    session: Session,
    store: BlobStore,
    name: str,
    model_dir: Path,
    *,
    engines: tuple[str, ...] = ("native",),
    aliases: tuple[str, ...] = (),
) -> CatalogModel:
    """Store the model's files and record it with its names (ConflictError when the name or an alias is another
    model's name or alias, removed models included, or a live adapter's; InvalidRequestError when a name breaks
    the rule of registry/model_names.py or the directory is not a servable model). Names are checked before
    anything is stored."""
    check_model_name(name)
    aliases = tuple(model_aliases(name, aliases))
    unknown = sorted(set(engines) - set(ENGINES))
    if not engines or unknown:
        raise InvalidRequestError(f"unknown engine(s) {unknown or '(none)'}; choose from {list(ENGINES)}")
    if get_live_model(session, name) is not None:
        raise ConflictError(
            f"base model {name!r} is already in the catalog; remove it first or choose a name"
        )
    check_names_free(session, name, aliases)
    model_dir = Path(model_dir)
    spec, config = _read_spec(model_dir)
    files = model_files(model_dir)
    if not any(p.suffix == ".safetensors" for p in files):
        raise InvalidRequestError(
            f"{model_dir} has no *.safetensors weights (convert with `lorahost import-model`)"
        )
    if not any(p.name == "tokenizer.json" for p in files):
        raise InvalidRequestError(f"{model_dir} has no tokenizer.json: the API tokenizes prompts with it")
    stored = []
    for path in files:
        digest = sha256_file(path)
        key = file_key(name, digest, path.name)
        if not store.exists(key):
            store.put_file(key, path)
        stored.append(ModelFile(path.name, digest, path.stat().st_size, key))
    store.put_stream(manifest_key(name), io.BytesIO(dump_manifest(name, stored)))  # last: workers read it
    records = [asdict(f) for f in stored]
    model = CatalogModel(
        name=name,
        model_type=spec.model_type,
        shape={
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_layers": spec.num_layers,
            "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": int(config.get("max_position_embeddings") or 0),
        },
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        files=records,
        num_bytes=sum(r["num_bytes"] for r in records),
        engines=list(engines),
        aliases=list(aliases),
        weight_norms=norms_to_json(base_weight_norms(model_dir)),
        status="ready",
    )
    session.add(model)
    session.flush()
    reserve_names(session, model)  # the primary key of base_model_names decides a race between two adds
    check_no_adapter_named(session, (name, *aliases))  # after the insert: an adapter's transaction waited
    return model


def _read_spec(model_dir: Path) -> tuple[BaseModelSpec, dict[str, Any]]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise InvalidRequestError(
            f"{model_dir} has no config.json: give a Hugging Face model directory (or convert a GGUF file "
            "with `lorahost import-model`)"
        )
    try:
        config = json.loads(config_path.read_text())
        return BaseModelSpec.from_hf_config(config), config
    except AdapterValidationError as exc:
        raise InvalidRequestError(f"{model_dir}: {exc}") from exc
    except (ValueError, OSError) as exc:
        raise InvalidRequestError(f"{config_path} is not readable JSON: {exc}") from exc


def get_live_model(session: Session, name: str) -> CatalogModel | None:
    """The catalog's live model named `name` (None if there is none)."""
    return session.scalars(
        select(CatalogModel).where(CatalogModel.name == name, CatalogModel.status == "ready")
    ).first()


def resolve_base_model_name(session: Session, ref: str) -> str | None:
    """The live base model a request's `model` names (its name or an alias), None when `ref` is no base model's
    name; NotFoundError when it names a removed model (or pins a version: a base model has none). A base-model
    name, removed or not, is never looked up as an adapter."""
    name, _, version = ref.partition("@")
    row = find_name(session, name)
    if row is None:
        return None
    model = row.model
    if model.status != "ready":
        raise NotFoundError(
            f"base model {model.name!r} was removed from the catalog; available: "
            f"{[m.name for m in list_base_models(session)]}",
            code="model_removed",
        )
    if version:
        raise NotFoundError(f"{ref!r}: base model {model.name!r} has no versions; use {model.name!r}")
    return model.name


def get_base_model(session: Session, name: str) -> CatalogModel:
    """The live model `name`; NotFoundError listing the available ones otherwise."""
    model = get_live_model(session, name)
    if model is None:
        names = [m.name for m in list_base_models(session)]
        raise NotFoundError(f"no base model {name!r} in the catalog; available: {names}")
    return model


def list_base_models(session: Session) -> list[CatalogModel]:
    """The live models, by name."""
    return list(
        session.scalars(
            select(CatalogModel).where(CatalogModel.status == "ready").order_by(CatalogModel.name)
        )
    )


def num_ready_adapters(session: Session, name: str) -> int:
    """Live adapters bound to base model `name` with at least one ready version."""
    query = (
        select(func.count(func.distinct(Adapter.id)))
        .join(AdapterVersion, AdapterVersion.adapter_id == Adapter.id)
        .where(
            Adapter.base_model_name == name, Adapter.deleted_at.is_(None), AdapterVersion.status == "ready"
        )
    )
    return int(session.scalar(query) or 0)


def remove_base_model(session: Session, name: str, *, is_forced: bool = False) -> CatalogModel:
    """Mark the model removed (its blobs stay until no version needs them; its names stay reserved);
    ConflictError while ready adapters are bound to it, unless forced."""
    model = get_base_model(session, name)
    num_adapters = num_ready_adapters(session, name)
    if num_adapters and not is_forced:
        raise ConflictError(
            f"base model {name!r} has {num_adapters} ready adapter(s) bound to it; their requests would fail. "
            "Remove them first, or force the removal (`lorahost models remove --force`, ?force=true)"
        )
    model.status = "removed"
    model.removed_at = utcnow()
    session.flush()
    return model


def set_prices(session: Session, name: str, prices: dict[str, dict[str, str]] | None) -> CatalogModel:
    """Set (or clear, with None) the live model's own token prices per plan name or "*"."""
    model = get_base_model(session, name)
    model.prices = prices
    session.flush()
    return model


def unpublish_manifest(store: BlobStore, name: str) -> None:
    """Delete a removed model's manifest, so no new worker starts on it (its files stay: running workers and
    a re-add of the same files reuse them)."""
    store.delete(manifest_key(name))
