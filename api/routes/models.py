"""/v1/models: the base models (the configured one and the catalog's) and every ready adapter the tenant can call
by name, OpenAI-style, a page at a time; an adapter's `parent` is its base model (as vLLM does)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter
from sqlalchemy.orm import Session

from api.deps import CurrentTenant, SessionDep, SettingsDep
from api.pagination import PageDep, page_response
from api.request_text import TextCheckedRoute
from api.schemas import ModelCard, PageResponse
from registry import repository
from registry.base_model_catalog import list_base_models
from registry.model_pages import model_page
from registry.models import Adapter, AdapterVersion
from settings import Settings

router = APIRouter(prefix="/v1/models", tags=["models"], route_class=TextCheckedRoute)


def _timestamp(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _base_card(name: str, created: int = 0) -> ModelCard:
    return ModelCard(id=name, created=created, owned_by="lorahost", root=name)


def _base_cards(session: Session, settings: Settings) -> dict[str, ModelCard]:
    """name -> card of every base model served: the catalog's live models and the configured one."""
    cards = {m.name: _base_card(m.name, _timestamp(m.created_at)) for m in list_base_models(session)}
    cards.setdefault(settings.base_model_name, _base_card(settings.base_model_name))
    return dict(sorted(cards.items()))


def _adapter_card(adapter: Adapter, version: AdapterVersion) -> ModelCard:
    return ModelCard(
        id=adapter.name,
        created=_timestamp(version.created_at),
        owned_by=adapter.tenant.name,
        root=adapter.base_model_name,
        parent=adapter.base_model_name,
        version=version.number,
        visibility=adapter.visibility,
    )


@router.get("", response_model=PageResponse)
def list_models(
    tenant: CurrentTenant, session: SessionDep, settings: SettingsDep, page: PageDep
) -> PageResponse:
    """The base models by name, then each adapter the tenant can call by its name with a ready version (its own,
    else the oldest public one of that name; its latest ready version), by name; a page at a time: `limit`
    (1-1000, default 100) and `after` (the previous page's `last_id`, a model name: registry/model_pages.py)."""
    base_cards = _base_cards(session, settings)
    found = model_page(session, tenant.id, base_cards, page)
    cards = [base_cards[name] for name in found.base_names]
    cards += [_adapter_card(a, v) for a, v in found.adapters]
    return page_response(cards, found.has_more)


@router.get("/{model}", response_model=ModelCard)
def get_model(model: str, tenant: CurrentTenant, session: SessionDep, settings: SettingsDep) -> ModelCard:
    """One model: a base model, an adapter (latest ready version) or `name@N`."""
    base_cards = _base_cards(session, settings)
    if model in base_cards:
        return base_cards[model]
    adapter, version = repository.resolve_model(session, tenant.id, model)
    card = _adapter_card(adapter, version)
    return card.model_copy(update={"id": model})
