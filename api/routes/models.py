"""/v1/models: the base model and every ready adapter the tenant may use, OpenAI-style."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter

from api.deps import CurrentTenant, SessionDep, SettingsDep
from api.schemas import ListResponse, ModelCard
from registry import repository
from registry.models import Adapter, AdapterVersion
from settings import Settings

router = APIRouter(prefix="/v1/models", tags=["models"])


def _timestamp(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _base_card(settings: Settings) -> ModelCard:
    return ModelCard(
        id=settings.base_model_name, created=0, owned_by="lorahost", root=settings.base_model_name
    )


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


@router.get("", response_model=ListResponse)
def list_models(tenant: CurrentTenant, session: SessionDep, settings: SettingsDep) -> ListResponse:
    """The base model plus each visible adapter with a ready version (its latest ready version)."""
    cards = [_base_card(settings)]
    cards += [_adapter_card(a, v) for a, v in repository.list_ready_models(session, tenant.id)]
    return ListResponse(data=cards)


@router.get("/{model}", response_model=ModelCard)
def get_model(model: str, tenant: CurrentTenant, session: SessionDep, settings: SettingsDep) -> ModelCard:
    """One model: the base model, an adapter (latest ready version) or `name@N`."""
    if model == settings.base_model_name:
        return _base_card(settings)
    adapter, version = repository.resolve_model(session, tenant.id, model)
    card = _adapter_card(adapter, version)
    return card.model_copy(update={"id": model})
