"""Usage rows for the usage lifecycle and lease tests, written through the registry's batch writers."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import repository
from registry.models import UsageRecord, new_id
from registry.usage_batches import open_usage

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def open_row(
    session: Session,
    tenant_id: str,
    owner: str = "api-1",
    worker_id: str | None = None,
    lease_renewed_at: datetime | None = None,
) -> str:
    """Open one in_progress usage row of `tenant_id` owned by API instance `owner`; return its request id."""
    request_id = f"req-{new_id()}"
    open_usage(
        session,
        [
            {
                "request_id": request_id,
                "tenant_id": tenant_id,
                "model_name": "m",
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "status": "in_progress",
                "api_instance_id": owner,
                "worker_id": worker_id,
                "started_at": T0,
                "lease_renewed_at": lease_renewed_at,
            }
        ],
    )
    return request_id


def checkpoint_row(
    request_id: str, completion: int, at: datetime = T0, worker_id: str | None = "w-1"
) -> dict:
    """A checkpoint of `completion` tokens (7 prompt tokens) taken `at`, as the usage writer sends it."""
    return {
        "request_id": request_id,
        "prompt_tokens": 7,
        "completion_tokens": completion,
        "ttft_ms": 5.0,
        "tpot_ms": 1.0,
        "e2e_ms": 50.0,
        "worker_id": worker_id,
        "checkpointed_at": at,
    }


def usage_rows(session: Session, tenant_id: str) -> dict[str, UsageRecord]:
    """The tenant's usage rows by request id, as the database holds them now."""
    session.expire_all()
    return {
        r.request_id: r
        for r in session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))
    }


def new_tenant(session: Session) -> str:
    """A new tenant's id."""
    return repository.create_tenant(session, f"t-{new_id()[:8]}").id
