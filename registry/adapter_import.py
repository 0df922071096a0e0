"""An adapter import (POST /v1/adapters with a JSON body): refuse what the tenant may not read, read the
source with the tenant's rights at request time (registry/import_sources.py), then the upload pipeline's steps
1-3 (registry/adapter_pipeline.py), its quotas included: checked before the source is touched, and for a Hub
repository against its declared sizes before a byte is downloaded."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from registry import model_names, repository, upload_quota
from registry.adapter_pipeline import AdapterJobContext, accept_upload
from registry.base_model_choice import names_of
from registry.import_sources import (
    SourceCredentials,
    check_import_allowed,
    parse_import_source,
    read_import_source,
)
from registry.models import AdapterVersion


def accept_import(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    source: str,
    credentials: SourceCredentials | None,
    work_dir: Path,
    base_model: str | None = None,
) -> AdapterVersion:
    """An import: refuse what this tenant may not read before reading anything, read the source into
    `work_dir` (registry/import_sources.py), then steps 1-3 as for an upload, its quotas included (blocking).
    The version records where it came from (`source_uri`, without credentials) and, from the Hub, the commit
    read (`source_revision`)."""
    num_bytes_left = upload_quota.precheck_quota(
        session, tenant_id, name, num_bytes=0
    )  # the plan's room left
    repository.check_adapter_name(name, reserved=tuple(names_of(ctx.base_model_choices(session))))
    model_names.check_adapter_name_free(session, name)  # base-model names, removed ones included
    session.commit()  # end the read: nothing is held open while the source is read
    if visibility is not None:
        repository.check_visibility(visibility)
    parsed = parse_import_source(source, ctx.settings)
    check_import_allowed(parsed, credentials, ctx.settings)
    imported = read_import_source(
        parsed, credentials, ctx.settings, work_dir, ctx.settings.limits.max_upload_bytes, num_bytes_left
    )
    return accept_upload(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=visibility,
        upload_dir=work_dir,
        names=imported.names,
        source_uri=parsed.redacted,
        source_revision=imported.source_revision,
        base_model=base_model,
    )
