"""/v1/admin/models: the base-model catalog (admin key only): list, look up, set prices, remove. Models are added with
`lorahost models add` (it imports, verifies and uploads the files: registry/base_model_catalog.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import AdminDep, ServicesDep, SessionDep
from api.pagination import PageDep, page_response
from api.request_text import TextCheckedRoute
from api.schemas import PRINTABLE_TEXT, CatalogModelPublic, CatalogModelUpdate, PageResponse
from registry import base_model_catalog
from registry.db import run_in_write_transaction
from registry.model_pages import catalog_model_page

router = APIRouter(prefix="/v1/admin/models", tags=["admin"], route_class=TextCheckedRoute)
ModelName = Annotated[str, Path(pattern=PRINTABLE_TEXT)]


def _public(session: SessionDep, model: object) -> CatalogModelPublic:
    card = CatalogModelPublic.model_validate(model)
    return card.model_copy(
        update={"num_ready_adapters": base_model_catalog.num_ready_adapters(session, card.name)}
    )


@router.get("", response_model=PageResponse)
def list_models(_: AdminDep, session: SessionDep, page: PageDep) -> PageResponse:
    """The catalog's live base models, by name, a page at a time: `limit` (1-1000, default 100) and `after`
    (the previous page's `last_id`: a model's name)."""
    found = catalog_model_page(session, page)
    return page_response([_public(session, m) for m in found.items], found.has_more, lambda card: card.name)


@router.get("/{name}", response_model=CatalogModelPublic)
def get_model(name: ModelName, _: AdminDep, session: SessionDep) -> CatalogModelPublic:
    """One base model: shape, files with digests, engines, aliases, adapters bound to it."""
    return _public(session, base_model_catalog.get_base_model(session, name))


@router.patch("/{name}", response_model=CatalogModelPublic)
def update_model(
    name: ModelName, body: CatalogModelUpdate, _: AdminDep, session: SessionDep
) -> CatalogModelPublic:
    """Set the model's own token prices per plan (billing uses them on its invoice lines; registry/billing.py)."""
    prices = None
    if body.prices is not None:
        prices = {
            plan: {k: str(v) for k, v in p.model_dump(exclude_none=True).items()}
            for plan, p in body.prices.items()
        }
    session.commit()
    model = run_in_write_transaction(session, lambda s: base_model_catalog.set_prices(s, name, prices))
    return _public(session, model)


@router.delete("/{name}", response_model=CatalogModelPublic)
def remove_model(
    name: ModelName,
    _: AdminDep,
    session: SessionDep,
    services: ServicesDep,
    force: Annotated[bool, Query(description="Remove even with ready adapters bound to it")] = False,
) -> CatalogModelPublic:
    """Remove a base model (409 while ready adapters are bound to it, unless force=true)."""
    session.commit()
    model = run_in_write_transaction(
        session, lambda s: base_model_catalog.remove_base_model(s, name, is_forced=force)
    )
    base_model_catalog.unpublish_manifest(services.blob_store, name)  # after the commit: no new worker on it
    return _public(session, model)
