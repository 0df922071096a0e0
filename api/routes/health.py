"""/v1/health: liveness plus a database round trip."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import SessionDep

router = APIRouter(prefix="/v1", tags=["health"])


@router.get("/health")
def health(session: SessionDep) -> dict[str, str]:
    """`{"status": "ok"}` when the API can reach its database."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}
