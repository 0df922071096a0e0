"""Reaching real services from tests: skip with a reason outside CI, fail under CI=true."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import is_ci

REDIS_URL = os.environ.get("LORAHOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def unavailable(what: str, error: Exception) -> None:
    """Skip (outside CI) or fail (under CI=true) because a service is unreachable."""
    message = f"{what} unreachable: {error}"
    if is_ci():
        pytest.fail(message + " (CI=true: service-backed tests must run)")
    pytest.skip(message)


def redis_with_prefix() -> Iterator[tuple[Any, str]]:
    """A live Redis client and a unique key prefix; deletes every key under the prefix afterwards."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any connection failure means "unreachable"
        unavailable(f"Redis at {REDIS_URL}", exc)
    prefix = f"lorahost-test:{uuid.uuid4().hex[:10]}:"
    try:
        yield client, prefix
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
