"""Wiring of the placement job (registry/placement_job.py): its routing-table store, its worker directory and
the HTTP call that asks a worker to drop an adapter. Used by the Celery task `lorahost.compute_placement`
(jobs/celery_app.py) and by the API's inline timer (api/main.py)."""

from __future__ import annotations

from typing import Any

import httpx

from cluster.membership import WorkerRecord
from cluster.protocol import INTERNAL_PREFIX
from cluster.routing_table import InMemoryRoutingTableStore, RedisRoutingTableStore, RoutingTableStore
from registry.placement_job import DropAdapter
from settings import Settings

DROP_TIMEOUT_S = 5.0


def make_routing_table_store(settings: Settings, client: Any = None) -> RoutingTableStore:
    """Redis when settings.storage.redis_url (or a given client), else a process-local store (embedded mode)."""
    if client is None and settings.storage.redis_url:
        import redis

        client = redis.Redis.from_url(settings.storage.redis_url)
    if client is None:
        return InMemoryRoutingTableStore()
    return RedisRoutingTableStore(client, f"{settings.jobs.celery_key_prefix}{settings.placement.key_prefix}")


def http_dropper(
    internal_token: str | None, timeout_s: float = DROP_TIMEOUT_S, client: httpx.Client | None = None
) -> DropAdapter:
    """A DropAdapter that POSTs {"adapter_key"} to the worker's /internal/v1/adapters/drop; True if dropped
    (False: the worker refused, requests use it). `client`: a client to send with (tests), else one each."""
    post = client.post if client is not None else httpx.post

    def drop(record: WorkerRecord, adapter_key: str) -> bool:
        headers = {"Authorization": f"Bearer {internal_token}"} if internal_token else {}
        response = post(
            f"{record.url.rstrip('/')}{INTERNAL_PREFIX}/adapters/drop",
            json={"adapter_key": adapter_key},
            headers=headers,
            timeout=timeout_s,
        )
        response.raise_for_status()
        return bool(response.json().get("dropped"))

    return drop
