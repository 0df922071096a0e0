"""/v1/adapters: upload (multipart, or an import from a URL or s3:// location), list, read, soft delete."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.caches import forget_model_name
from api.deps import CurrentTenant, ServicesDep, SessionDep
from api.errors import ApiError
from api.openapi import inline_json_schema
from api.request_text import TextCheckedRoute, check_json_text
from api.schemas import (
    AdapterDeleted,
    AdapterImport,
    AdapterPublic,
    AdapterVersionPublic,
    ListResponse,
    UploadAccepted,
)
from api.services import Services
from api.upload_rate import admit_upload
from api.uploads import client_disconnected, receive_upload, upload_scratch_dir
from registry import adapter_import, adapter_pipeline, repository, upload_quota
from registry.db import run_in_write_transaction
from registry.models import AdapterVersion

router = APIRouter(prefix="/v1/adapters", tags=["adapters"], route_class=TextCheckedRoute)
MAX_JSON_BYTES = 64 * 1024

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
    https URL, or s3:// with the tenant's own credentials; registry/import_sources.py).

    The plan's upload quotas apply: 429 past uploads_per_min, 403 past max_adapters, 413 past
    max_stored_bytes (each error names the limit)."""
    quota = upload_quota.read_quota(session, tenant.id)
    session.commit()  # end the auth read transaction: nothing is held open while the body streams in
    admit_upload(services.rate_limiter, tenant.id, quota)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        version = await _accept_multipart(request, tenant.id, session, services)
    elif content_type.startswith("application/json"):
        version = await _accept_import(request, tenant.id, session, services)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send multipart/form-data (name + files) or JSON {name, source[, credentials]}",
        )
    await run_in_threadpool(services.jobs.validate_adapter_version, version.id)
    return _accepted(session, version.id)


async def _accept_multipart(
    request: Request, tenant_id: str, session: Session, services: Services
) -> AdapterVersion:
    scratch = upload_scratch_dir(services.settings)
    with tempfile.TemporaryDirectory(prefix="lorahost-upload-", dir=scratch) as tmp:
        received = await receive_upload(request, Path(tmp), services.settings.limits.max_upload_bytes)
        return await run_in_threadpool(
            adapter_pipeline.accept_upload,
            session,
            services.job_context,
            tenant_id=tenant_id,
            name=received.name,
            visibility=received.visibility,
            upload_dir=Path(tmp),
            names=received.filenames,
            base_model=received.base_model,
        )


async def _accept_import(
    request: Request, tenant_id: str, session: Session, services: Services
) -> AdapterVersion:
    try:
        body = await request.body()
    except ClientDisconnect:
        raise client_disconnected("import request") from None
    if len(body) > MAX_JSON_BYTES:
        raise ApiError(413, "payload_too_large", f"JSON body larger than {MAX_JSON_BYTES} bytes")
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_request", f"the body must be JSON: {exc}") from None
    check_json_text(raw)  # before pydantic: a lone surrogate is a 400 naming the field
    try:
        payload = AdapterImport.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    # the plan's quotas before the source is touched (its bytes are checked again once they are known)
    await run_in_threadpool(upload_quota.precheck_quota, session, tenant_id, payload.name, num_bytes=0)
    credentials = payload.credentials.to_credentials() if payload.credentials else None
    scratch = upload_scratch_dir(services.settings)
    with tempfile.TemporaryDirectory(prefix="lorahost-import-", dir=scratch) as tmp:
        return await run_in_threadpool(
            adapter_import.accept_import,
            session,
            services.job_context,
            tenant_id=tenant_id,
            name=payload.name,
            visibility=payload.visibility,
            source=payload.source,
            credentials=credentials,
            work_dir=Path(tmp),
            base_model=payload.base_model,
        )


def _accepted(session: Session, version_id: str) -> UploadAccepted:
    session.expire_all()  # the job may have changed the row through another session
    version = repository.get_version(session, version_id)
    adapter = version.adapter
    return UploadAccepted(
        adapter=adapter.name,
        adapter_id=adapter.id,
        visibility=adapter.visibility,
        version=AdapterVersionPublic.from_row(adapter, version),
    )


@router.get("", response_model=ListResponse)
def list_adapters(tenant: CurrentTenant, session: SessionDep, include_public: bool = False) -> ListResponse:
    """The tenant's adapters (and everyone's public adapters with include_public=true)."""
    if include_public:
        adapters = repository.list_visible_adapters(session, tenant.id)
    else:
        adapters = repository.list_own_adapters(session, tenant.id)
    return ListResponse(data=[AdapterPublic.from_row(a, viewer_tenant_id=tenant.id) for a in adapters])


@router.get("/{ref}", response_model=AdapterPublic)
def get_adapter(ref: str, tenant: CurrentTenant, session: SessionDep) -> AdapterPublic:
    """One adapter with its versions' status and failure reasons; `name@N` shows only version N."""
    parsed = repository.parse_model_ref(ref)
    adapter = repository.find_visible_adapter(session, tenant.id, parsed.name)
    if parsed.version is None:
        return AdapterPublic.from_row(adapter, viewer_tenant_id=tenant.id)
    version = repository.pick_version(adapter, parsed.version, is_ready_only=False)
    return AdapterPublic.from_row(adapter, [version], viewer_tenant_id=tenant.id)


@router.delete("/{name}", response_model=AdapterDeleted)
def delete_adapter(
    name: str, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> AdapterDeleted:
    """Soft-delete one of the tenant's adapters (all its versions stop being served: at once through this
    API process, within settings.api.model_cache_ttl_s through the others)."""
    if "@" in name:
        raise ApiError(400, "invalid_request", "delete removes a whole adapter: use its name without @N")
    session.commit()  # end the auth read: the delete runs in a write transaction of its own
    adapter = run_in_write_transaction(session, lambda s: repository.soft_delete_adapter(s, tenant.id, name))
    forget_model_name(services.model_cache, name)
    return AdapterDeleted(id=adapter.id, name=adapter.name)
