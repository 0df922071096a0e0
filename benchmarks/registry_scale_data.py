"""A big operator's registry written straight into PostgreSQL with COPY (issue 38 item 3): tenants, their adapters
and versions, keys and a year of usage, for benchmarks/registry_scale.py.

Shape at scale 1 (the issue's): 10,000 tenants, 200,000 adapter versions, of which the first tenant ("big") holds
20,000 (19,001 adapters: one of them with 1,000 versions, the rest with one); every other tenant holds adapters of
3 versions (5% failed, the rest ready), a tenth of them public, named from a shared pool so that public names
collide across tenants (as /v1/models resolves them); one key per tenant; `num_usage_rows` requests over the
last 365 days, a tenth of them the big tenant's. `--scale 0.1` divides every count but the usage rows by ten.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

BIG_SHARE_OF_USAGE = 0.1
NUM_VERSIONS_PER_ADAPTER = 3
NUM_NAMES = 50_000  # the pool other tenants' adapter names come from: public names collide across tenants
PUBLIC_EVERY = 10
FAILED_EVERY = 20
BASE_MODEL = "lorahost-base"
YEAR_S = 365 * 86_400


@dataclass(frozen=True)
class RegistryShape:
    """How big the generated registry is."""

    num_tenants: int
    num_versions: int
    num_big_versions: int  # the big tenant's
    num_big_adapter_versions: int  # of the big tenant's versions, those of its one many-version adapter
    num_usage_rows: int

    @classmethod
    def at_scale(cls, scale: float, num_usage_rows: int) -> RegistryShape:
        """The issue's sizes times `scale` (the usage rows as given)."""
        return cls(
            num_tenants=max(2, round(10_000 * scale)),
            num_versions=max(10, round(200_000 * scale)),
            num_big_versions=max(4, round(20_000 * scale)),
            num_big_adapter_versions=max(2, round(1_000 * scale)),
            num_usage_rows=num_usage_rows,
        )


@dataclass(frozen=True)
class Generated:
    """What a benchmark needs to find in the generated registry."""

    big_tenant_id: str
    small_tenant_id: str
    big_adapter_name: str  # the big tenant's many-version adapter
    num_rows: dict[str, int]
    seconds: float


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _moment(now: datetime, fraction: float) -> datetime:
    """A moment `fraction` of the way through the last two years (0: two years ago)."""
    return now - timedelta(seconds=(1.0 - fraction) * 2 * YEAR_S)


def _copy(engine: Engine, table: str, columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> int:
    """COPY rows into a table in one transaction; the number of rows."""
    raw = engine.raw_connection()
    num_rows = 0
    try:
        cursor = raw.driver_connection.cursor()  # type: ignore[union-attr]
        with cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                num_rows += 1
        raw.commit()
    finally:
        raw.close()
    return num_rows


def _tenant_rows(shape: RegistryShape, rng: random.Random, now: datetime) -> list[tuple[Any, ...]]:
    return [
        (_uuid(rng), "big" if i == 0 else f"tenant-{i:05d}", True, False, _moment(now, i / shape.num_tenants))
        for i in range(shape.num_tenants)
    ]


def _adapter_plan(shape: RegistryShape, tenant_ids: list[str]) -> Iterator[tuple[int, str, str, int]]:
    """(tenant index, tenant id, adapter name, number of versions) of every adapter, the big tenant's first."""
    big = tenant_ids[0]
    yield 0, big, "big-00000", shape.num_big_adapter_versions
    for j in range(1, shape.num_big_versions - shape.num_big_adapter_versions + 1):
        yield 0, big, f"big-{j:05d}", 1
    num_small = max(0, (shape.num_versions - shape.num_big_versions) // NUM_VERSIONS_PER_ADAPTER)
    num_others = len(tenant_ids) - 1
    for k in range(num_small):
        t = 1 + k % num_others
        j = k // num_others  # the tenant's j-th adapter: distinct names within a tenant
        yield t, tenant_ids[t], f"lora-{(t * 7919 + j * 104_729) % NUM_NAMES:05d}", NUM_VERSIONS_PER_ADAPTER


def generate(engine: Engine, shape: RegistryShape, seed: int = 0) -> Generated:
    """Write the registry into the (migrated, empty) database of `engine`."""
    started = time.perf_counter()
    rng, now = random.Random(seed), datetime.now(UTC)
    tenants = _tenant_rows(shape, rng, now)
    tenant_ids = [row[0] for row in tenants]
    num_rows = {
        "tenants": _copy(
            engine, "tenants", ("id", "name", "is_active", "can_manage_keys", "created_at"), tenants
        )
    }
    adapters, versions, names_of = [], [], {}
    for a, (t, tenant_id, name, num_versions) in enumerate(_adapter_plan(shape, tenant_ids)):
        adapter_id, created = _uuid(rng), _moment(now, 0.5 + 0.5 * rng.random())
        visibility = "public" if t > 0 and a % PUBLIC_EVERY == 0 else "private"
        adapters.append((adapter_id, tenant_id, name, visibility, BASE_MODEL, created))
        names_of.setdefault(tenant_id, []).append((adapter_id, name))
        for n in range(1, num_versions + 1):
            status = "failed" if (a + n) % FAILED_EVERY == 0 else "ready"
            versions.append((_uuid(rng), adapter_id, n, status, 16, 32.0, created + timedelta(minutes=n)))
    num_rows["adapters"] = _copy(
        engine,
        "adapters",
        ("id", "tenant_id", "name", "visibility", "base_model_name", "created_at"),
        adapters,
    )
    num_rows["adapter_versions"] = _copy(
        engine,
        "adapter_versions",
        ("id", "adapter_id", "number", "status", "rank", "alpha", "created_at"),
        versions,
    )
    keys = ((_uuid(rng), tenant_id, "salt", "unusable", now) for tenant_id in tenant_ids)
    num_rows["api_keys"] = _copy(
        engine, "api_keys", ("id", "tenant_id", "salt", "secret_hash", "created_at"), keys
    )
    num_rows["usage_records"] = _copy(
        engine, "usage_records", USAGE_COLUMNS, _usage_rows(shape, rng, now, names_of)
    )
    with engine.begin() as conn:  # committed: a rolled-back ANALYZE leaves no statistics
        conn.exec_driver_sql("ANALYZE")
    return Generated(tenant_ids[0], tenant_ids[1], "big-00000", num_rows, time.perf_counter() - started)


USAGE_COLUMNS = (
    "id", "request_id", "tenant_id", "adapter_id", "model_name", "base_model_name", "prompt_tokens",
    "completion_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "status", "started_at", "finished_at",
)  # fmt: skip


def _usage_rows(
    shape: RegistryShape, rng: random.Random, now: datetime, names_of: dict[str, list[tuple[str, str]]]
) -> Iterator[tuple[Any, ...]]:
    """`num_usage_rows` requests over the last year: a tenth the big tenant's, the rest spread over all tenants."""
    tenant_ids = list(names_of)
    big = tenant_ids[0]
    for i in range(shape.num_usage_rows):
        tenant_id = big if rng.random() < BIG_SHARE_OF_USAGE else tenant_ids[rng.randrange(len(tenant_ids))]
        adapter_id, name = rng.choice(names_of[tenant_id][:50])  # a tenant's traffic goes to a few adapters
        started = now - timedelta(seconds=YEAR_S * (i + 1) / (shape.num_usage_rows + 1))
        prompt, completion = rng.randrange(20, 2000), rng.randrange(1, 500)
        ttft = rng.uniform(20, 400)
        yield (
            f"u{i:012d}", f"req-{i:012d}", tenant_id, adapter_id, name, BASE_MODEL, prompt, completion, ttft,
            rng.uniform(5, 50), ttft + 20 * completion, "ok", started, started + timedelta(seconds=2),
        )  # fmt: skip


def find_generated(engine: Engine) -> Generated:
    """What `generate` returned, found again in a database it filled before (kept with --keep-db)."""
    started = time.perf_counter()
    with engine.connect() as conn:
        ids = dict(
            conn.exec_driver_sql("SELECT name, id FROM tenants WHERE name IN ('big', 'tenant-00001')").all()
        )
        num_rows = {
            table: int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
            for table in ("tenants", "adapters", "adapter_versions", "api_keys", "usage_records")
        }
    if len(ids) != 2:
        raise ValueError("this database was not filled by benchmarks/registry_scale_data.py generate")
    return Generated(ids["big"], ids["tenant-00001"], "big-00000", num_rows, time.perf_counter() - started)
