"""/v1/adapters: upload (multipart, or an import from a URL, s3:// location or Hub repository), list, read,
soft delete. The work: api/actions/adapters.py (the upload's body is read into typed parts by api/upload_request.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.actions import adapters
from api.deps import CurrentTenant, ServicesDep, SessionDep
from api.openapi import inline_json_schema
from api.pagination import PageDep
from api.request_text import TextCheckedRoute
from api.schemas import AdapterDeleted, AdapterImport, AdapterPublic, PageResponse, UploadAccepted
from api.upload_request import upload_from_request

router = APIRouter(prefix="/v1/adapters", tags=["adapters"], route_class=TextCheckedRoute)

UPLOAD_OPENAPI = {
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name", "files"],
                    "properties": {
                        "name": {"type": "string"},
                        "visibility": {"type": "string", "enum": ["private", "public"]},
                        "base_model": {"type": "string"},
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                    },
                }
            },
            "application/json": {"schema": inline_json_schema(AdapterImport)},
        }
    }
}


@router.post("", status_code=202, response_model=UploadAccepted, openapi_extra=UPLOAD_OPENAPI)
async def upload_adapter(
    request: Request, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> UploadAccepted:
    """Upload a new adapter version: the PEFT files or one .zip/.tar.gz, or an import (JSON body: a presigned
    https URL, s3:// with the tenant's own credentials, or hf://org/name[@revision] with the tenant's own
    hf_token for a private repository; registry/import_sources.py).

    The plan's upload quotas apply: 429 past uploads_per_min, 403 past max_adapters, 413 past
    max_stored_bytes (each error names the limit)."""
    return await upload_from_request(request, tenant, session, services)


@router.get("", response_model=PageResponse)
def list_adapters(
    tenant: CurrentTenant, session: SessionDep, page: PageDep, include_public: bool = False
) -> PageResponse:
    """The tenant's adapters by name (and everyone's public adapters with include_public=true, by name then
    age), a page at a time: `limit` (1-1000, default 100) and `after` (the previous page's `last_id`)."""
    return adapters.list_adapters(tenant.id, session, page, include_public)


@router.get("/{ref}/versions", response_model=PageResponse)
def list_versions(ref: str, tenant: CurrentTenant, session: SessionDep, page: PageDep) -> PageResponse:
    """The versions of one adapter (the tenant's own or a public one) by number, a page at a time: `limit`
    (1-1000, default 100) and `after` (the previous page's `last_id`)."""
    return adapters.list_versions(ref, tenant.id, session, page)


@router.get("/{ref}", response_model=AdapterPublic)
def get_adapter(ref: str, tenant: CurrentTenant, session: SessionDep) -> AdapterPublic:
    """One adapter with its versions' status and failure reasons; `name@N` shows only version N."""
    return adapters.get_adapter(ref, tenant.id, session)


@router.delete("/{name}", response_model=AdapterDeleted)
def delete_adapter(
    name: str, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> AdapterDeleted:
    """Soft-delete one of the tenant's adapters (all its versions stop being served: at once through this
    API process, within settings.api.model_cache_ttl_s through the others)."""
    return adapters.delete_adapter(name, tenant.id, session, services)
