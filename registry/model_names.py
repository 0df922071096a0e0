"""Base-model names and aliases (issue 33 items 5 and 6): one name rule, one table of the names taken.

The rule (`check_model_name`, `check_alias`): a name is one or two segments (`name` or `org/name`, the shape of a
Hugging Face repo id, which is what adapters' configs put in `base_model_name_or_path`); a segment is 1-96 ASCII
letters, digits, '-', '_' or '.', starting and ending with a letter or digit, with no '..'. A catalog model's
own name is the strict form of the same rule: one segment of lowercase letters, digits, '-' and '.', at most 64
characters (it names blob folders and Kubernetes objects). `fullmatch` throughout: `re.match(...$)` accepted
a trailing newline. So no whitespace, control character, markup, '/' at either end or '..' can reach a blob
key, a page or a log line.

The table `base_model_names` holds one row per name and alias (case-folded: aliases match adapter configs
case-insensitively), its primary key the name, pointing at the model that holds it. Rows stay when a model is
removed: a removed model's names stay reserved. So:
  * two models (or a model and another's alias, or two aliases) never share a name, even when added at the
    same time: the second insert fails on the primary key (ConflictError);
  * a new model may take over the names a removed model *of the same name* held (a re-add), nothing else;
  * no tenant's adapter can be named like a base model or alias, live or removed (`check_adapter_name_free`),
    and no model or alias can be added under a live adapter's name (`check_no_adapter_named`). For the race
    between the two, an adapter's write transaction takes `LOCK TABLE base_model_names IN SHARE MODE` on
    PostgreSQL (SQLite's write transaction already excludes other writers): a model add's insert waits for it,
    then sees the adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from registry.errors import ConflictError, InvalidRequestError
from registry.models import Adapter, BaseModelName, CatalogModel, Tenant

MODEL_NAME_RE = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,62}[a-z0-9])?")
_SEGMENT = r"[A-Za-z0-9](?:[-A-Za-z0-9._]{0,94}[A-Za-z0-9])?"
ALIAS_RE = re.compile(rf"(?:{_SEGMENT}/)?{_SEGMENT}")
ADAPTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # registry/repository.py's adapter rule
MODEL_NAME_RULE = "use 1-64 lowercase letters, digits, '-' or '.', starting and ending with a letter or digit"
ALIAS_RULE = (
    "an alias is `name` or `org/name` (a Hugging Face repo id), each part 1-96 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit, with no '..'"
)


def fold(name: str) -> str:
    """The form names are compared in (the rule allows ASCII only, so lower() is a full case fold)."""
    return name.lower()


def check_model_name(name: str) -> str:
    """A catalog model's name, or InvalidRequestError saying the rule."""
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidRequestError(f"invalid base model name {name!r}: {MODEL_NAME_RULE}", code="invalid_name")
    return name


def check_alias(alias: str) -> str:
    """A model alias, or InvalidRequestError saying the rule."""
    if not isinstance(alias, str) or not ALIAS_RE.fullmatch(alias) or ".." in alias:
        raise InvalidRequestError(f"invalid base model alias {alias!r}: {ALIAS_RULE}", code="invalid_name")
    return alias


def could_name_a_model(name: str) -> bool:
    """True when `name` could be an adapter's, a base model's or an alias (the request path asks the database
    about nothing else)."""
    return bool(ADAPTER_NAME_RE.fullmatch(name) or ALIAS_RE.fullmatch(name))


def model_aliases(name: str, aliases: Iterable[str]) -> list[str]:
    """The aliases to record for model `name`: each checked, without the name itself or a repeat (folded)."""
    seen = {fold(name)}
    out = []
    for alias in aliases:
        check_alias(alias)
        if fold(alias) not in seen:
            seen.add(fold(alias))
            out.append(alias)
    return sorted(out)


def find_name(session: Session, name: str) -> BaseModelName | None:
    """The row of a base-model name or alias (live or removed model), or None."""
    return session.get(BaseModelName, fold(name))


def _holder(row: BaseModelName) -> str:
    model = row.model
    what = "an alias" if row.is_alias else "the name"
    removed = " (removed from the catalog; its names stay reserved)" if model.status != "ready" else ""
    return f"{what} of base model {model.name!r}{removed}"


def check_names_free(session: Session, name: str, aliases: Iterable[str]) -> None:
    """ConflictError when `name` or an alias is held by another model (a removed model of the same name
    excepted: a re-add takes its names over) or by a live adapter."""
    for wanted in (name, *aliases):
        row = find_name(session, wanted)
        if row is not None and not _is_takeover(row, name):
            raise ConflictError(
                f"{wanted!r} is {_holder(row)}; choose another name or alias", code="name_taken"
            )
    check_no_adapter_named(session, (name, *aliases))


def _is_takeover(row: BaseModelName, name: str) -> bool:
    return row.model.status != "ready" and row.model.name == name


def check_no_adapter_named(session: Session, names: Iterable[str]) -> None:
    """ConflictError (for the operator) when a live adapter of any tenant has one of `names`."""
    folded = {fold(n) for n in names}
    query = (
        select(Adapter.name, Tenant.name)
        .join(Tenant, Adapter.tenant_id == Tenant.id)
        .where(Adapter.deleted_at.is_(None), Adapter.name.in_(folded))
        .limit(1)
    )
    found = session.execute(query).first()
    if found is not None:
        raise ConflictError(
            f"{found[0]!r} is the name of an adapter of tenant {found[1]!r}: a base model's name or alias would "
            "take that adapter's requests; choose another name or alias (or have the adapter deleted first)",
            code="name_taken",
        )


def reserve_names(session: Session, model: CatalogModel) -> None:
    """Record `model`'s name and aliases (flushed): a new row per name, or a removed same-named model's row taken
    over; ConflictError when another model got one first (the primary key decides a race)."""
    for wanted, is_alias in ((model.name, False), *((a, True) for a in model.aliases)):
        row = find_name(session, wanted)
        if row is None:
            session.add(BaseModelName(name=fold(wanted), model_id=model.id, is_alias=is_alias))
            continue
        if not _is_takeover(row, model.name):
            raise ConflictError(f"{wanted!r} is {_holder(row)}; choose another name", code="name_taken")
        taken = session.execute(
            update(BaseModelName)
            .where(BaseModelName.name == row.name, BaseModelName.model_id == row.model_id)
            .values(model_id=model.id, is_alias=is_alias)
            .execution_options(synchronize_session=False)
        )
        session.expire(row)
        if taken.rowcount != 1:  # type: ignore[attr-defined]
            raise ConflictError(
                f"{wanted!r} was just taken by another model; choose another name", code="name_taken"
            )
    try:
        session.flush()
    except IntegrityError as exc:
        raise ConflictError(
            f"a name or alias of {model.name!r} was just taken by another model; choose another",
            code="name_taken",
        ) from exc


def lock_names(session: Session) -> None:
    """Hold off model adds until this transaction ends (PostgreSQL; SQLite's write lock already does)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("LOCK TABLE base_model_names IN SHARE MODE"))


def check_adapter_name_free(session: Session, name: str, *, is_locked: bool = False) -> None:
    """InvalidRequestError when an adapter may not be called `name`: it is a base model's name or alias, live or
    removed (a request for it must never reach a tenant's adapter). `is_locked`: take lock_names first (in the
    write transaction that creates the adapter)."""
    if is_locked:
        lock_names(session)
    row = find_name(session, name)
    if row is not None:
        raise InvalidRequestError(
            f"adapter name {name!r} is reserved: it is {_holder(row)}; choose another name for your adapter",
            code="name_reserved",
        )
