"""Every list page's queries run on an index on PostgreSQL: each list is read once with its queries captured,
then each captured query is EXPLAINed with sequential scans switched off (a query no index serves still
plans a Seq Scan then) and checked for the index its keyset needs (migration 0022 and the older ones); so is
billing's sum over a period of every tenant's rows (migration 0023), and the reads of rolled days from the daily
usage rollup (migration 0024)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, event, insert
from sqlalchemy.orm import Session

from registry import account_pages, adapter_pages
from registry.billing import usage_totals
from registry.db import make_engine
from registry.model_pages import model_page
from registry.models import Adapter, AdapterVersion, ApiKey, UsageRecord, new_id
from registry.pages import PageRequest
from registry.usage_pages import usage_group_page
from registry.usage_rollup import roll_up_day
from tests.registry.page_rows import add_tenant, at

pytestmark = pytest.mark.slow  # PostgreSQL only

NUM_TENANTS = 20
NUM_ADAPTERS_PER_TENANT = 10
NUM_BIG = 2000  # the first tenant's adapters, keys and usage rows: enough that a plan reads a page, not all
DAY0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def pg_session(postgres_url: str) -> Iterator[Session]:
    """A PostgreSQL session whose work is rolled back after the test."""
    engine = make_engine(postgres_url)
    connection = engine.connect()
    transaction = connection.begin()
    try:
        with Session(bind=connection, join_transaction_mode="create_savepoint") as session:
            yield session
    finally:
        transaction.rollback()
        connection.close()
        engine.dispose()


def _seed(session: Session) -> tuple[str, Adapter]:
    """Tenants with adapters (a third public; versions ready and failed), keys and usage rows, the first tenant
    with NUM_BIG of each and its first adapter with NUM_BIG versions; that tenant's id and adapter."""
    tenants = [add_tenant(session, f"t{i}", created_at=at(i)) for i in range(NUM_TENANTS)]
    adapters, versions, keys, usage = [], [], [], []
    for t, tenant in enumerate(tenants):
        for a in range(NUM_BIG if t == 0 else NUM_ADAPTERS_PER_TENANT):
            adapter_id = new_id()
            public = "public" if a % 3 == 0 else "private"
            adapters.append({"id": adapter_id, "tenant_id": tenant.id, "name": f"a{a:05d}", "visibility": public,
                                 "base_model_name": "base", "created_at": at(a)})  # fmt: skip
            num_versions = NUM_BIG if t == a == 0 else 2
            versions += [
                {
                    "id": new_id(),
                    "adapter_id": adapter_id,
                    "number": n,
                    "status": ("ready", "failed")[n % 2],
                    "created_at": at(a),
                }
                for n in range(1, num_versions + 1)
            ]
            keys.append(
                {"id": new_id(), "tenant_id": tenant.id, "salt": "s", "secret_hash": "h", "created_at": at(a)}
            )
            usage.append({"id": new_id(), "request_id": new_id(), "tenant_id": tenant.id, "model_name": f"a{a % 7}",
                              "status": "ok", "started_at": DAY0 + timedelta(minutes=a)})  # fmt: skip
    for model, rows in (
        (Adapter, adapters),
        (AdapterVersion, versions),
        (ApiKey, keys),
        (UsageRecord, usage),
    ):
        session.execute(insert(model), rows)
    session.connection().exec_driver_sql("ANALYZE")
    return tenants[0].id, session.get_one(Adapter, adapters[0]["id"])


def _captured(session: Session, read: Callable[[], object]) -> list[tuple[str, Any]]:
    """The SELECTs `read` runs on the session's connection, with their parameters."""
    statements: list[tuple[str, Any]] = []
    connection = session.connection()

    def capture(_conn: Connection, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(connection, "before_cursor_execute", capture)
    try:
        read()
    finally:
        event.remove(connection, "before_cursor_execute", capture)
    return statements


def _plans(session: Session, read: Callable[[], object]) -> list[str]:
    statements = _captured(session, read)
    connection = session.connection()
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    try:
        return [
            "\n".join(row[0] for row in connection.exec_driver_sql(f"EXPLAIN {statement}", parameters))
            for statement, parameters in statements
        ]
    finally:
        connection.exec_driver_sql("SET LOCAL enable_seqscan = on")


LISTS: dict[str, tuple[Callable[[Session, str, Any], object], set[str]]] = {
    "own adapters": (
        lambda s, t, a: adapter_pages.own_adapter_page(s, t, PageRequest(limit=5, after=a.id)),
        {"uq_adapters_tenant_name_live"},
    ),
    "visible adapters": (
        lambda s, t, a: adapter_pages.visible_adapter_page(s, t, PageRequest(limit=5, after=a.id)),
        {"uq_adapters_tenant_name_live", "ix_adapters_public_name"},
    ),
    "versions": (
        lambda s, t, a: adapter_pages.version_page(s, a, PageRequest(limit=1)),
        {"uq_adapter_versions_adapter_number"},
    ),
    "models": (
        lambda s, t, a: model_page(s, t, ["base"], PageRequest(limit=5, after="a00010")),
        {"uq_adapters_tenant_name_live", "ix_adapters_public_name", "ix_adapter_versions_ready"},
    ),
    "tenants": (
        lambda s, t, a: account_pages.tenant_page(s, PageRequest(limit=5, after=t)),
        {"ix_tenants_created_at_id"},
    ),
    "keys": (
        lambda s, t, a: account_pages.api_key_page(s, t, PageRequest(limit=5)),
        {"ix_api_keys_tenant_created"},
    ),
    "usage": (
        lambda s, t, a: usage_group_page(s, t, DAY0, DAY0 + timedelta(days=30), PageRequest(limit=2)),
        # either usage index (a substring of both names): the tenant's, or, since this tenant holds 90% of
        # the rows, the period's, which also gives started_at order
        {"ix_usage_records_"},
    ),
    "price plans": (
        lambda s, t, a: account_pages.price_plan_page(s, PageRequest(limit=5)),
        {"uq_price_plans_name"},
    ),
    "billing's period sums": (
        lambda s, t, a: usage_totals(s, DAY0, DAY0 + timedelta(hours=2)),
        {"ix_usage_records_started"},
    ),
}


@pytest.mark.parametrize("name", list(LISTS))
def test_every_query_of_a_list_page_runs_on_its_indexes(pg_session: Session, name: str) -> None:
    tenant_id, adapter = _seed(pg_session)
    read, indexes = LISTS[name]
    plans = _plans(pg_session, lambda: read(pg_session, tenant_id, adapter))
    assert plans, "the list ran no query"
    assert not [plan for plan in plans if "Seq Scan" in plan], "\n\n".join(plans)
    used = "\n".join(plans)
    assert {index for index in indexes if index not in used} == set(), used


ROLLED_READS: dict[str, tuple[Callable[[Session, str], object], set[str]]] = {
    "usage of rolled days": (
        lambda s, t: usage_group_page(s, t, DAY0, DAY0 + timedelta(days=30), PageRequest(limit=2)),
        {"pk_usage_days", "pk_rolled_usage_days"},
    ),
    "billing's sums of rolled days": (
        lambda s, t: usage_totals(s, DAY0, DAY0 + timedelta(days=2)),
        {"ix_usage_days_day", "pk_rolled_usage_days"},
    ),
}


@pytest.mark.parametrize("name", list(ROLLED_READS))
def test_reads_of_rolled_days_run_on_the_rollups_indexes(pg_session: Session, name: str) -> None:
    tenant_id, _ = _seed(pg_session)
    assert roll_up_day(pg_session, DAY0.date(), DAY0 + timedelta(days=2))
    pg_session.connection().exec_driver_sql("ANALYZE")
    read, indexes = ROLLED_READS[name]
    plans = _plans(pg_session, lambda: read(pg_session, tenant_id))
    assert not [plan for plan in plans if "Seq Scan" in plan], "\n\n".join(plans)
    used = "\n".join(plans)
    assert {index for index in indexes if index not in used} == set(), used
