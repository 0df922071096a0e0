"""The long-lived services an API process holds (on `app.state.services`), built once from settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.dispatch import JobDispatcher, make_job_dispatcher
from registry import keys
from registry.adapter_pipeline import AdapterJobContext, limits_from_settings
from registry.db import make_engine, make_session_factory
from registry.settings import Settings
from registry.storage import BlobStore, make_blob_store


@dataclass
class Services:
    """Everything routes use besides the request. `extras` is for services added by later features."""

    settings: Settings
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    job_context: AdapterJobContext
    jobs: JobDispatcher
    admin_key_hash: str | None = None
    engine: Engine | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Release connections (engine owned by these services only)."""
        if self.engine is not None:
            self.engine.dispose()


def build_services(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    blob_store: BlobStore | None = None,
    jobs: JobDispatcher | None = None,
) -> Services:
    """Services from settings; pass any piece to use it instead (tests, embedding)."""
    engine = None
    if session_factory is None:
        engine = make_engine(settings.resolved_database_url())
        session_factory = make_session_factory(engine)
    blob_store = blob_store or make_blob_store(settings)
    ctx = AdapterJobContext(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        limits=limits_from_settings(settings),
    )
    return Services(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        job_context=ctx,
        jobs=jobs or make_job_dispatcher(settings, ctx),
        admin_key_hash=None if settings.admin_key else keys.read_admin_key_hash(settings.data_dir),
        engine=engine,
    )
