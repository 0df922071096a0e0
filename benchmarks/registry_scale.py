"""The list endpoints on a big operator's registry (issue 38 item 3): p50/p99 of every list call, through the API.

Generates the registry straight into PostgreSQL (benchmarks/registry_scale_data.py: 10,000 tenants, 200,000 adapter
versions, one tenant with 20,000, times --scale; --num-usage-rows requests over a year, --issue-usage for the
issue's 20 M), then walks each list page by page (`after` = the previous page's `last_id`), from its first page
and from the middle of the list, through the app in-process (FastAPI TestClient: routing, auth, the DB queries and
the JSON, no network; the startup heap frozen as a served API process freezes it, api/http_server.py), and prints
a table and one JSON line per list (ms per call: p50, p99, max).

    python -m benchmarks.registry_scale --scale 0.1            # a quick run: a tenth of the sizes
    python -m benchmarks.registry_scale --issue-usage          # the issue's sizes, 20 M usage rows
    python -m benchmarks.registry_scale --db-url postgresql+psycopg://...   # an empty database of your own
    python -m benchmarks.registry_scale --db-url ... --is-generated  # measure again a database kept by --keep-db

The daily usage rollup is filled first (every settled day, timed) as the usage sweep would; --no-rollup leaves
it empty, so billing and /v1/usage sum raw rows. Without --db-url it creates a database on --pg-admin-url's server and drops it at the end (--keep-db keeps it).
Not a test: the numbers depend on the machine and on what else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url

from api.main import create_app
from api.serving_heap import ServingHeap
from benchmarks.registry_scale_data import Generated, RegistryShape, find_generated, generate
from benchmarks.run_info import cpu_model, git_state
from benchmarks.serving_metrics import pct, rnd
from migrations.runner import upgrade
from registry import api_keys
from registry.db import make_engine, make_session_factory
from registry.usage_rollup import roll_up_usage
from settings import Settings
from settings.storage import MeteringSettings

ADMIN_KEY = "bench-admin"
ISSUE_USAGE_ROWS = 20_000_000
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def tenant_key(engine: Engine, tenant_id: str) -> dict[str, str]:
    """Auth headers of a new key of the tenant (the generated keys cannot authenticate)."""
    with make_session_factory(engine)() as session:
        _, key = api_keys.create_api_key(session, tenant_id)
        session.commit()
    return {"Authorization": f"Bearer {key}"}


def walk(
    client: TestClient, path: str, headers: dict[str, str], num_calls: int, after: str | None
) -> list[float]:
    """ms of up to num_calls consecutive page calls of `path`, starting after `after`, following last_id."""
    times = []
    for _ in range(num_calls):
        params = {"after": after} if after else {}
        started = time.perf_counter()
        response = client.get(path, params=params, headers=headers)
        times.append(1000 * (time.perf_counter() - started))
        assert response.status_code == 200, response.text
        body = response.json()
        if not body["has_more"]:
            break
        after = body["last_id"]
    return times


def middle_cursor(client: TestClient, path: str, headers: dict[str, str], num_items: int) -> str | None:
    """The last_id of the page ending near the middle of a list of about num_items items (pages of 1000)."""
    after = None
    for _ in range(max(0, num_items // 2000)):
        body = client.get(
            path, params={"limit": 1000, **({"after": after} if after else {})}, headers=headers
        ).json()
        if not body["has_more"]:
            break
        after = body["last_id"]
    return after


def lists(
    gen: Generated, shape: RegistryShape, big: dict[str, str], small: dict[str, str]
) -> list[tuple[str, str, dict[str, str], int]]:
    """(label, path, headers, about how many items) of every list call measured."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    num_big_adapters = shape.num_big_versions - shape.num_big_adapter_versions + 1
    return [
        ("adapters (big tenant)", "/v1/adapters", big, num_big_adapters),
        ("adapters + public (big tenant)", "/v1/adapters?include_public=true", big, num_big_adapters),
        ("adapters + public (small tenant)", "/v1/adapters?include_public=true", small, shape.num_versions // 30),
        ("versions (1,000-version adapter)", f"/v1/adapters/{gen.big_adapter_name}/versions", big, shape.num_big_adapter_versions),
        ("models (big tenant)", "/v1/models", big, num_big_adapters),
        ("models (small tenant)", "/v1/models", small, shape.num_versions // 30),
        ("keys (big tenant)", "/v1/keys", big, 2),
        ("tenants (admin)", "/v1/admin/tenants", admin, shape.num_tenants),
        ("usage, last 30 days (big tenant)", "/v1/usage", big, 30 * 50),
    ]  # fmt: skip


def percentiles(times: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of the call times (ms)."""
    return {"p50_ms": rnd(pct(times, 50)), "p99_ms": rnd(pct(times, 99)), "max_ms": rnd(max(times))}


def measure(client: TestClient, gen: Generated, shape: RegistryShape, big: dict[str, str], small: dict[str, str],
            num_calls: int) -> list[dict[str, Any]]:  # fmt: skip
    """One result per list: num_calls page calls, walking the list from its first page and from its middle in
    turn (again and again on a short list)."""
    results = []
    for label, path, headers, num_items in lists(gen, shape, big, small):
        walk(client, path, headers, 3, None)  # warm-up
        middle = middle_cursor(client, path, headers, num_items)
        times: list[float] = []
        while len(times) < num_calls:
            for start in (None, middle):
                times += walk(client, path, headers, num_calls - len(times), start)
        results.append({"list": label, "path": path, "num_calls": len(times), **percentiles(times)})
    return results + measure_billing(client, max(3, num_calls // 60))


def measure_billing(client: TestClient, num_calls: int) -> list[dict[str, Any]]:
    """Billing over every tenant (GET /v1/admin/billing: the invoice lines of a period, summed in the database)
    for the last 30 days and the last year, num_calls times each after one warm-up call."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    now = datetime.now(UTC)
    results = []
    for label, days in (("billing, last 30 days (admin)", 30), ("billing, last 365 days (admin)", 365)):
        params = {"start": (now - timedelta(days=days)).isoformat(), "end": now.isoformat()}
        times: list[float] = []
        for _ in range(num_calls + 1):
            started = time.perf_counter()
            response = client.get("/v1/admin/billing", params=params, headers=admin)
            times.append((time.perf_counter() - started) * 1e3)
            response.raise_for_status()
        results.append(
            {"list": label, "path": "/v1/admin/billing", "num_calls": num_calls, **percentiles(times[1:])}
        )
    return results


def print_table(results: list[dict[str, Any]]) -> None:
    """The results as a plain table."""
    print(f"{'list':36} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in results:
        print(
            f"{r['list']:36} {r['num_calls']:>6} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f}"
        )


def roll_up_everything(engine: Engine) -> dict[str, Any]:
    """Roll up every settled day, as the usage sweep does a month at a time; how long it took."""
    started = time.perf_counter()
    num_days = 0
    with make_session_factory(engine)() as session:
        while days := roll_up_usage(session, MeteringSettings().rollup_settle_s):
            num_days += len(days)
    seconds = time.perf_counter() - started
    with (
        engine.connect() as conn
    ):  # the statistics autovacuum keeps in steady state, taken now for a new table
        conn.exec_driver_sql("ANALYZE usage_days")
        conn.commit()  # statistics are transactional: uncommitted, the ANALYZE is lost
    return {"rolled_days": num_days, "rollup_s": round(seconds, 1)}


def run(
    db_url: str, shape: RegistryShape, num_calls: int, is_rolled_up: bool = True, is_generated: bool = False
) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        gen = find_generated(engine) if is_generated else generate(engine, shape)
        print(
            json.dumps(
                {"bench": "registry_scale", "generated": gen.num_rows, "generate_s": round(gen.seconds, 1)}
            ),
            flush=True,
        )
        big, small = tenant_key(engine, gen.big_tenant_id), tenant_key(engine, gen.small_tenant_id)
        if is_rolled_up and not is_generated:
            print(json.dumps({"bench": "registry_scale", **roll_up_everything(engine)}), flush=True)
    finally:
        engine.dispose()
    with tempfile.TemporaryDirectory(prefix="lorahost-registry-bench-") as tmp:
        settings = Settings(
            data_dir=Path(tmp), admin_key=ADMIN_KEY, database_url=db_url, cold_start_timeout_s=0.0,
            placement_interval_s=0.0, usage_sweep_interval_s=0.0, upload_sweep_interval_s=0.0,
            predictor_training_interval_s=0.0,
        )  # fmt: skip
        with TestClient(create_app(settings)) as client:
            ServingHeap().start()  # as a served API process does once started (api/http_server.py)
            results = measure(client, gen, shape, big, small, num_calls)
    print_table(results)
    context = {"cpu": cpu_model(), "load_avg": [round(x, 2) for x in os.getloadavg()], "commit": git_state().get("commit"),
               "shape": shape.__dict__}  # fmt: skip
    for result in results:
        print(json.dumps({"bench": "registry_scale", **result, **context}), flush=True)


def with_database(admin_url: str, keep: bool, work: Callable[[str], None]) -> None:
    """Run `work` on a new database of the server at admin_url, dropped afterwards unless `keep`."""
    name = f"lorahost_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        work(make_url(admin_url).set(database=name).render_as_string(hide_password=False))
    finally:
        if keep:
            print(f"kept database {name}")
        else:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="times the issue's tenants and versions")
    parser.add_argument("--num-usage-rows", type=int, default=200_000)
    parser.add_argument(
        "--issue-usage", action="store_true", help=f"{ISSUE_USAGE_ROWS:,} usage rows (the issue's)"
    )
    parser.add_argument("--num-calls", type=int, default=300, help="page calls per list")
    parser.add_argument("--db-url", default=None, help="an empty PostgreSQL database (default: a new one)")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument(
        "--is-generated",
        action="store_true",
        help="--db-url holds a registry this benchmark generated (and rolled up) before: measure only",
    )
    parser.add_argument(
        "--no-rollup",
        action="store_true",
        help="leave the daily usage rollup empty (every read sums raw rows)",
    )
    args = parser.parse_args()
    shape = RegistryShape.at_scale(args.scale, ISSUE_USAGE_ROWS if args.issue_usage else args.num_usage_rows)
    if args.db_url:
        run(args.db_url, shape, args.num_calls, not args.no_rollup, args.is_generated)
    else:
        with_database(
            args.pg_admin_url, args.keep_db, lambda url: run(url, shape, args.num_calls, not args.no_rollup)
        )


if __name__ == "__main__":
    main()
