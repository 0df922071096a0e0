"""The worker protocol's pure helpers."""

from __future__ import annotations

from cluster.protocol import prefix_cache_namespace


def test_a_tenant_s_own_namespace_never_equals_a_shared_one() -> None:
    tenant_id = "0b9e9a2e-5d0c-4f4e-9d4c-1f1f1f1f1f1f"
    assert prefix_cache_namespace(tenant_id) == f"tenant:{tenant_id}"
    assert prefix_cache_namespace(tenant_id, "team") == "shared:team"
    assert prefix_cache_namespace("x", tenant_id) != prefix_cache_namespace(
        tenant_id
    )  # a shared name = an id
    assert prefix_cache_namespace(None) is None  # no tenant: direct engine use
