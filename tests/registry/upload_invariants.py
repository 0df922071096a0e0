"""Invariants every finished upload must leave behind, whatever ran concurrently or failed.

- every version is final (`ready` or `failed`): none stuck in `uploading`/`validating`;
- versions of each adapter are numbered 1..N with no gap and no duplicate;
- every blob belongs to a version row, and every row's blobs exist (no orphan either way);
- nothing is left under the staging prefix `uploads/`.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.models import Adapter, AdapterVersion
from registry.storage import BlobStore


def version_numbers_by_name(session: Session) -> dict[str, list[int]]:
    """Live adapter name -> its version numbers, sorted."""
    rows = session.execute(
        select(Adapter.name, AdapterVersion.number)
        .join(AdapterVersion, AdapterVersion.adapter_id == Adapter.id)
        .where(Adapter.deleted_at.is_(None))
    )
    numbers: dict[str, list[int]] = defaultdict(list)
    for name, number in rows:
        numbers[name].append(number)
    return {name: sorted(values) for name, values in numbers.items()}


def assert_no_orphans(session: Session, blob_store: BlobStore) -> None:
    """No version left in flight, no blob without a row, no row without its blobs, no staging blob."""
    versions = session.scalars(select(AdapterVersion)).all()
    in_flight = [(v.id, v.status) for v in versions if v.status not in ("ready", "failed")]
    assert in_flight == [], f"versions left in flight: {in_flight}"
    row_keys = {k for v in versions for k in (v.config_blob_key, v.weights_blob_key) if k}
    stored = set(blob_store.list_keys())
    assert stored - row_keys == set(), "blobs with no version row"
    assert row_keys - stored == set(), "version rows whose blobs are missing"
    assert blob_store.list_keys("uploads/") == []
    assert all(v.status == "ready" or not (v.config_blob_key or v.weights_blob_key) for v in versions)


def assert_numbered_without_gaps(session: Session, expected: dict[str, int]) -> None:
    """Each adapter name in `expected` has exactly versions 1..expected[name]."""
    numbers = version_numbers_by_name(session)
    assert numbers == {name: list(range(1, n + 1)) for name, n in expected.items()}
