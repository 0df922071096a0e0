"""What the web console costs the API: server time of each console page against the REST route that reads the
same data, on a seeded usage ledger of --num-rows requests (30 days, --num-tenants tenants of 4 adapters each).

Both go through the same app in-process (FastAPI TestClient, no network), on SQLite (embedded mode) or the
--db-url given (PostgreSQL). Each pair is measured --num-repeats times, interleaved; one JSON line per pair with
the median and p90 in ms and the ratio console / REST. The tenant pages read the first tenant's rows (1 /
num_tenants of the ledger); the operator pages read all of it.

    python benchmarks/console_pages.py --num-rows 10000 100000
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import insert

from api.main import create_app
from benchmarks.run_info import cpu_model, git_state
from migrations.runner import upgrade
from registry import api_keys, repository
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord, new_id
from settings import Settings

ADMIN_KEY = "bench-admin"
LOGIN_CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
STATUSES = ("ok",) * 17 + ("error", "aborted", "rejected")


def seed(settings: Settings, num_rows: int, num_tenants: int) -> str:
    """The ledger: tenants on one plan, 4 adapters each, num_rows requests over 30 days; the first tenant's key."""
    factory = make_session_factory(make_engine(settings.storage.database_url))
    with factory() as session:
        plan = repository.create_price_plan(session, "bench", slo_ttft_ms=200.0, slo_tpot_ms=40.0)
        tenants = [repository.create_tenant(session, f"t{i}", plan_id=plan.id) for i in range(num_tenants)]
        session.flush()
        _, key = api_keys.create_api_key(session, tenants[0].id)
        session.commit()
        now = datetime.now(UTC)
        rows = [
            {
                "id": new_id(), "request_id": f"r{i}", "tenant_id": tenants[i % num_tenants].id,
                "model_name": f"adapter-{i % 4}", "base_model_name": "lorahost-base",
                "prompt_tokens": 100 + i % 400, "completion_tokens": 20 + i % 200,
                "ttft_ms": 50.0 + i % 300, "tpot_ms": 10.0 + i % 40, "e2e_ms": 500.0 + i % 900,
                "status": STATUSES[i % len(STATUSES)],
                "started_at": now - timedelta(seconds=(i * 2_592_000) // num_rows),
            }
            for i in range(num_rows)
        ]  # fmt: skip
        for lo in range(0, num_rows, 5000):
            session.execute(insert(UsageRecord), rows[lo : lo + 5000])
        session.commit()
    return key


def sign_in(client: TestClient, key: str) -> None:
    """Sign the client in through the console's form. Its token is in the form (an HMAC of the cookie's nonce),
    not the cookie: sending the cookie's value stopped working when the login CSRF token changed, and the pages
    then answered with the sign-in page, which TestClient's redirect following reached with a 200."""
    match = LOGIN_CSRF_RE.search(client.get("/console/login").text)
    if match is None:
        raise RuntimeError("the console's sign-in form has no CSRF token")
    response = client.post(
        "/console/login", data={"key": key, "csrf_token": match.group(1)}, follow_redirects=False
    )
    if response.status_code != 303:
        raise RuntimeError(f"console sign-in answered {response.status_code}: {response.text[:200]}")


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    response = call()
    assert getattr(response, "status_code", 200) == 200, getattr(response, "text", "")
    assert not getattr(response, "history", None), "redirected (to the sign-in page?): not the page asked for"
    return 1000 * (time.perf_counter() - start)


def measure(
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]], num_repeats: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Console and REST times per pair, interleaved (one warm-up each first)."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pairs}
    for console, rest in pairs.values():
        console(), rest()
    for _ in range(num_repeats):
        for name, (console, rest) in pairs.items():
            times[name][0].append(timed(console))
            times[name][1].append(timed(rest))
    return times


def run(num_rows: int, num_tenants: int, num_repeats: int, db_url: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="lorahost-console-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp), admin_key=ADMIN_KEY, database_url=db_url or f"sqlite:///{tmp}/bench.db",
                            placement_interval_s=0.0, cold_start_timeout_s=0.0)  # fmt: skip
        upgrade(settings.storage.database_url)
        key = seed(settings, num_rows, num_tenants)
        tenant, admin = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {ADMIN_KEY}"}
        with TestClient(create_app(settings)) as rest, TestClient(create_app(settings)) as page_t, \
                TestClient(create_app(settings)) as page_a:  # fmt: skip
            sign_in(page_t, key)
            sign_in(page_a, ADMIN_KEY)
            pairs = {
                "tenant usage (/console/usage vs /v1/usage)": (
                    lambda: page_t.get("/console/usage"), lambda: rest.get("/v1/usage", headers=tenant)),
                "billing (/console/admin/billing vs /v1/admin/billing)": (
                    lambda: page_a.get("/console/admin/billing"), lambda: rest.get("/v1/admin/billing", headers=admin)),
                "SLO by tenant (/console/admin/slo vs /v1/admin/slo)": (
                    lambda: page_a.get("/console/admin/slo?bucket=day"),
                    lambda: rest.get("/v1/admin/slo?group_by=tenant", headers=admin)),
                "adapters (/console/adapters vs /v1/adapters)": (
                    lambda: page_t.get("/console/adapters"), lambda: rest.get("/v1/adapters", headers=tenant)),
            }  # fmt: skip
            for name, (console_ms, rest_ms) in measure(pairs, num_repeats).items():
                console_p50, rest_p50 = statistics.median(console_ms), statistics.median(rest_ms)
                print(json.dumps({
                    "bench": "console_pages", "pair": name, "num_rows": num_rows, "num_tenants": num_tenants,
                    "console_p50_ms": round(console_p50, 1), "rest_p50_ms": round(rest_p50, 1),
                    "console_p90_ms": round(statistics.quantiles(console_ms, n=10)[-1], 1),
                    "rest_p90_ms": round(statistics.quantiles(rest_ms, n=10)[-1], 1),
                    "console_over_rest": round(console_p50 / rest_p50, 2),
                    "db": "postgresql" if db_url else "sqlite", "cpu": cpu_model(), "commit": git_state().get("commit"),
                }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-rows", type=int, nargs="+", default=[10_000])
    parser.add_argument("--num-tenants", type=int, default=10)
    parser.add_argument("--num-repeats", type=int, default=7)
    parser.add_argument("--db-url", default=None, help="a PostgreSQL URL (an empty database); default SQLite")
    args = parser.parse_args()
    for num_rows in args.num_rows:
        run(num_rows, args.num_tenants, args.num_repeats, args.db_url)


if __name__ == "__main__":
    main()
