"""The HTTP side of an adapter upload (POST /v1/adapters and the console's drop zone): read the body into
typed parts (the multipart form's files in a scratch folder, or the JSON import) and hand them to the actions
of api/actions/adapters.py. multipart/form-data: api/uploads.py; application/json: an AdapterImport."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.actions import adapters
from api.errors import ApiError
from api.request_text import check_json_text
from api.schemas import AdapterImport, UploadAccepted
from api.services import Services
from api.uploads import client_disconnected, receive_upload, upload_scratch_dir
from registry.models import AdapterVersion, Tenant

MAX_JSON_BYTES = 64 * 1024


async def upload_from_request(
    request: Request, tenant: Tenant, session: Session, services: Services
) -> UploadAccepted:
    """Admit the upload (quotas), read its body by content type, store it and start its validation."""
    adapters.admit_upload_of(tenant, session, services)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        version = await _accept_multipart(request, tenant.id, session, services)
    elif content_type.startswith("application/json"):
        payload = await read_import(request)
        version = await run_in_threadpool(adapters.accept_import, payload, tenant.id, session, services)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send multipart/form-data (name + files) or JSON {name, source[, credentials or hf_token]}",
        )
    return await run_in_threadpool(adapters.start_validation, version.id, session, services)


async def _accept_multipart(
    request: Request, tenant_id: str, session: Session, services: Services
) -> AdapterVersion:
    scratch = upload_scratch_dir(services.settings)
    with tempfile.TemporaryDirectory(prefix="lorahost-upload-", dir=scratch) as tmp:
        received = await receive_upload(request, Path(tmp), services.settings.limits.max_upload_bytes)
        return await run_in_threadpool(
            adapters.accept_files, received, Path(tmp), tenant_id, session, services
        )


async def read_import(request: Request) -> AdapterImport:
    """The JSON import body (at most MAX_JSON_BYTES; 400 for bad JSON or text, 422 for a bad shape)."""
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
        return AdapterImport.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
