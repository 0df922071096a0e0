"""A tenant's adapters: upload (received files or an import from a URL or s3:// location), list, read, soft
delete (/v1/adapters and the console's adapter pages). The HTTP side of an upload (reading the multipart body
or the JSON import into typed parts) is api/upload_request.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy.orm import Session

from api.caches import forget_model_name
from api.errors import ApiError
from api.pagination import page_response
from api.schemas import (
    AdapterDeleted,
    AdapterImport,
    AdapterPublic,
    AdapterVersionPublic,
    PageResponse,
    UploadAccepted,
)
from api.services import Services
from api.upload_rate import admit_upload
from api.uploads import ReceivedUpload, upload_scratch_dir
from registry import adapter_import, adapter_pages, adapter_pipeline, repository, upload_quota
from registry.db import run_in_write_transaction
from registry.hub_source import HubCredentials
from registry.import_sources import SourceCredentials
from registry.models import AdapterVersion, Tenant
from registry.pages import PageRequest


def admit_upload_of(tenant: Tenant, session: Session, services: Services) -> None:
    """Before the body is read: the plan's uploads_per_min (429); ends the auth read transaction so nothing is
    held open while the body streams in."""
    quota = upload_quota.read_quota(session, tenant.id)
    session.commit()
    admit_upload(services.rate_limiter, tenant.id, quota)


def accept_files(
    received: ReceivedUpload, upload_dir: Path, tenant_id: str, session: Session, services: Services
) -> AdapterVersion:
    """Store the received files of `upload_dir` as a new `validating` version (quotas: 403/413)."""
    return adapter_pipeline.accept_upload(
        session,
        services.job_context,
        tenant_id=tenant_id,
        name=received.name,
        visibility=received.visibility,
        upload_dir=upload_dir,
        names=received.filenames,
        base_model=received.base_model,
    )


def accept_import(
    payload: AdapterImport, tenant_id: str, session: Session, services: Services
) -> AdapterVersion:
    """Fetch the import's source (quotas checked before it is touched) into a scratch folder of its own and
    store it as a new `validating` version."""
    credentials = import_credentials(payload)
    scratch = upload_scratch_dir(services.settings)
    with tempfile.TemporaryDirectory(prefix="lorahost-import-", dir=scratch) as tmp:
        return adapter_import.accept_import(
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


def import_credentials(payload: AdapterImport) -> SourceCredentials | None:
    """The registry's plain form of whichever credentials the import sent (400 when both kinds were)."""
    if payload.credentials is not None and payload.hf_token is not None:
        raise ApiError(
            400, "invalid_source", "send credentials (for s3://) or hf_token (for hf://), not both"
        )
    if payload.hf_token is not None:
        return HubCredentials(token=payload.hf_token.get_secret_value())
    return payload.credentials.to_credentials() if payload.credentials is not None else None


def start_validation(version_id: str, session: Session, services: Services) -> UploadAccepted:
    """Queue (or, embedded, run) the version's validation job; the accepted version as it is now."""
    services.jobs.validate_adapter_version(version_id)
    session.expire_all()  # the job may have changed the row through another session
    version = repository.get_version(session, version_id)
    adapter = version.adapter
    return UploadAccepted(
        adapter=adapter.name,
        adapter_id=adapter.id,
        visibility=adapter.visibility,
        version=AdapterVersionPublic.from_row(adapter, version),
    )


def list_adapters(
    tenant_id: str, session: Session, page: PageRequest, include_public: bool = False
) -> PageResponse:
    """A page of the tenant's adapters by name (with include_public, everyone's public adapters too, by name
    then age)."""
    if include_public:
        found = adapter_pages.visible_adapter_page(session, tenant_id, page)
    else:
        found = adapter_pages.own_adapter_page(session, tenant_id, page)
    data = [AdapterPublic.from_row(a, viewer_tenant_id=tenant_id) for a in found.items]
    return page_response(data, found.has_more)


def list_versions(ref: str, tenant_id: str, session: Session, page: PageRequest) -> PageResponse:
    """A page of the versions, by number, of an adapter visible to the tenant (its own or a public one)."""
    parsed = repository.parse_model_ref(ref)
    if parsed.version is not None:
        raise ApiError(400, "invalid_request", "versions are listed per adapter: use its name without @N")
    adapter = repository.find_visible_adapter(session, tenant_id, parsed.name, with_versions=False)
    found = adapter_pages.version_page(session, adapter, page)
    return page_response([AdapterVersionPublic.from_row(adapter, v) for v in found.items], found.has_more)


def get_adapter(ref: str, tenant_id: str, session: Session) -> AdapterPublic:
    """One adapter visible to the tenant with its versions; `name@N` shows only version N."""
    parsed = repository.parse_model_ref(ref)
    adapter = repository.find_visible_adapter(session, tenant_id, parsed.name)
    if parsed.version is None:
        return AdapterPublic.from_row(adapter, viewer_tenant_id=tenant_id)
    version = repository.pick_version(adapter, parsed.version, is_ready_only=False)
    return AdapterPublic.from_row(adapter, [version], viewer_tenant_id=tenant_id)


def delete_adapter(name: str, tenant_id: str, session: Session, services: Services) -> AdapterDeleted:
    """Soft-delete one of the tenant's adapters (all its versions stop being served: at once through this API
    process, within settings.api.model_cache_ttl_s through the others)."""
    if "@" in name:
        raise ApiError(400, "invalid_request", "delete removes a whole adapter: use its name without @N")
    session.commit()  # end the auth read: the delete runs in a write transaction of its own
    adapter = run_in_write_transaction(session, lambda s: repository.soft_delete_adapter(s, tenant_id, name))
    forget_model_name(services.model_cache, name)
    return AdapterDeleted(id=adapter.id, name=adapter.name)
