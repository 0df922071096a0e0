"""A twin worker's router view is kept between arrivals and refreshed, not rebuilt, while only its
step-by-step numbers change (twin/cluster_node.py): over random traces, with KV pressure (preemptions),
adapter copies, evictions and placement drops, the kept view always equals one rebuilt through the production
conversion (`cluster.worker_view.worker_view` of the worker's stats)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.worker_view import worker_view
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.routing.router import WorkerView
from settings import Settings
from tests.twin.profile_helpers import round_cost_model
from twin.cluster_node import with_fields
from twin.cluster_sim import ClusterOptions, ClusterSim
from twin.trace import AdapterSpec, TraceRequest

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 4096)
MB = 1_000_000
ADAPTERS = [AdapterSpec(name, rank=rank, num_bytes=MB) for name, rank in [("a", 8), ("b", 16), ("c", 32)]]


class CheckedClusterSim(ClusterSim):
    """Compares every kept view with a rebuilt one whenever the router reads them."""

    num_checks = 0
    num_refreshes = 0  # checks where the kept view was refreshed (not rebuilt)
    num_queue_refreshes = 0  # refreshes that read the queues' signals again (the queues changed)

    def _route(self, request: TraceRequest, moment: float) -> None:
        for node in self._running_nodes():
            structure = node._view_structure_key()
            is_refresh = node._view is not None and structure == node._view_structure
            is_queue_refresh = is_refresh and node.sim.core.scheduler.version != node._view_queues
            assert node.view() == worker_view(node.stats()), node.worker_id
            CheckedClusterSim.num_checks += 1
            CheckedClusterSim.num_refreshes += is_refresh
            CheckedClusterSim.num_queue_refreshes += is_queue_refresh
        super()._route(request, moment)


_requests = st.lists(
    st.tuples(
        st.floats(0.0, 2.0, allow_nan=False),
        st.integers(1, 60),
        st.integers(1, 300),
        st.sampled_from([None, "a", "b", "c"]),
        st.sampled_from([None, "t1", "t2"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=_requests, num_kv_blocks=st.integers(12, 64), num_workers=st.integers(1, 3))
def test_a_kept_view_always_equals_a_rebuilt_one(
    requests: list[tuple[float, int, int, str | None, str | None]], num_kv_blocks: int, num_workers: int
) -> None:
    trace = [
        TraceRequest(f"r{i}", t, p, o, adapter_id=a, tenant_id=tenant)
        for i, (t, p, o, a, tenant) in enumerate(requests)
    ]
    geometry = MemoryGeometry.plan(
        SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=0,
        num_kv_blocks=num_kv_blocks, adapter_cache_bytes=2 * MB, max_lora_rank=64,
    )  # fmt: skip
    flat: dict[str, Any] = {
        "engine_cpu_prefill_workers": 0, "engine_enable_prefix_caching": False, "engine_max_num_seqs": 4,
        "placement_interval_s": 0.3, "placement_bucket_s": 0.3,
    }  # fmt: skip
    options = ClusterOptions(num_initial_workers=num_workers, is_autoscaling=False, adapter_fetch_s=0.05)
    sim = CheckedClusterSim(Settings(**flat), geometry, round_cost_model(), ADAPTERS, options)
    sim.run(trace)
    for node in sim.nodes.values():
        assert node.view() == worker_view(node.stats())


def test_the_property_refreshes_kept_views() -> None:
    test_a_kept_view_always_equals_a_rebuilt_one()
    assert CheckedClusterSim.num_refreshes > 0
    assert CheckedClusterSim.num_queue_refreshes > 0


def test_with_fields_equals_dataclasses_replace() -> None:
    view = WorkerView("w", "m", num_running=2, running_ranks=(8, 16), adapter_ranks={"a": 8})
    changes: dict[str, Any] = {"num_free_pool_pages": 7, "decode_step_ms": 1.5, "waiting_ranks": (32,)}
    assert with_fields(view, **changes) == replace(view, **changes)
    assert with_fields(view, **changes) is not view and view.num_free_pool_pages == 0
    # what makes them equal: nothing runs in __init__ but the field assignments
    assert not hasattr(WorkerView, "__post_init__")
    assert all(f.init for f in fields(WorkerView))
