"""`ClusterNode`: one worker of the cluster twin: a `SimulatedWorker` plus what the worker process adds around
its engine (gpu_workers/worker/worker_service.py, adapter_manager.py): its lifecycle (starting, ready,
draining, stopped), its host cache of adapter files, fetches in flight, adapter drops, and its published
state, built by the worker's own conversion (`cluster.worker_stats.build_worker_stats`) and read by the router through the one conversion `cluster.worker_view.worker_view`.
The router reads all workers' views at every arrival; a view is rebuilt through those conversions only when
the core's adapters, the host cache or the lifecycle changed (`_view_structure_key`, on the residency's
version counter), and otherwise gets what changed read as the stats would read it: the queues' signals
(`scheduler_stats.queue_signals`, when `BatchScheduler.version` moved: an add, a finish, a full plan) and the
numbers that change step by step (free pool pages, step medians): equal to a rebuilt view
(tests/twin/test_cluster_node.py).

Invariants: an adapter is in `host_cached` once its fetch has landed and stays there (drops unload the
device copy only, as the worker's do); a request is submitted to the engine only once its adapter's files
are in `host_cached`; `num_fetching` counts requests routed here whose fetch has not landed.
"""

from __future__ import annotations

from dataclasses import replace

from cluster.membership import WorkerRecord
from cluster.protocol import WorkerStats
from cluster.worker_stats import WorkerState, build_worker_stats
from cluster.worker_view import worker_view
from scheduler.core.adapter_residency import Residency
from scheduler.core.engine_counters import median_ms
from scheduler.core.scheduler_stats import queue_signals
from scheduler.routing.router import WorkerView
from twin.trace import AdapterSpec, TraceRequest
from twin.worker_sim import SimulatedWorker


class ClusterNode:
    """One simulated worker process (module doc). `ready_s` None while it starts; `stopped_s` once gone."""

    def __init__(self, sim: SimulatedWorker, base_model: str, max_num_seqs: int, started_s: float) -> None:
        self.sim = sim
        self.base_model = base_model
        self.max_num_seqs = max_num_seqs
        self.started_s = started_s
        self.ready_s: float | None = None
        self.stopped_s: float | None = None
        self.is_draining = False
        self.host_cached: dict[str, AdapterSpec] = {}
        self.fetch_done_at: dict[str, float] = {}  # adapter -> when its files land here
        self.num_fetching = 0
        self.num_adapter_unloads = 0
        self._cache_key: tuple[object, ...] | None = None
        self._stats: WorkerStats | None = None
        self._record: WorkerRecord | None = None
        self._view: WorkerView | None = None
        self._view_state: tuple[object, ...] | None = None  # the `_state_key` and `_view_structure` of _view
        self._view_structure: tuple[object, ...] | None = None
        self._view_queues = -1  # the core's queue version (`BatchScheduler.version`) _view was read at

    @property
    def worker_id(self) -> str:
        """The worker's id (its SimulatedWorker's)."""
        return self.sim.worker_id

    @property
    def is_ready(self) -> bool:
        """Routable: started, not draining, not stopped."""
        return self.ready_s is not None and not self.is_draining and self.stopped_s is None

    @property
    def is_busy(self) -> bool:
        """True while a request runs, waits in the engine or waits for its adapter's files."""
        return self.num_fetching > 0 or self.sim.is_busy

    # ---- requests and adapters ------------------------------------------------------------------------

    def submit(self, request: TraceRequest, now: float) -> None:
        """Hand a request to the engine at `now` (its adapter's files are here): the engine sees its receipt
        time as the arrival, the record keeps the front door's arrival (TTFT is measured from there)."""
        spec = self.host_cached.get(request.adapter_id) if request.adapter_id is not None else None
        if spec is not None and self.sim.core.residency.get(spec.adapter_id) is None:
            self.sim.register_adapter(spec)  # after a drop: re-registered from the host cache
        self.sim.submit(replace(request, arrival_s=now))
        self.sim.records[request.request_id].arrival_s = request.arrival_s

    def land_fetch(self, adapter: AdapterSpec) -> None:
        """The adapter's files are in the host cache now."""
        self.host_cached.setdefault(adapter.adapter_id, adapter)
        self.fetch_done_at.pop(adapter.adapter_id, None)

    def drop(self, adapter_id: str) -> bool:
        """The placement job's drop (AdapterManager.drop -> LLMEngine.unload_adapter): unload the device copy
        unless requests use it or it is not on the device; True if unloaded."""
        core = self.sim.core
        if adapter_id in self.fetch_done_at or core.residency.residency(adapter_id) != Residency.DEVICE:
            return False
        if core.scheduler.is_adapter_in_use(adapter_id):
            return False
        core.residency.forget(adapter_id)
        self.sim.executor.drop_adapter(adapter_id)
        self.num_adapter_unloads += 1
        return True

    # ---- published state ------------------------------------------------------------------------------

    def stats(self) -> WorkerStats:
        """The worker's published state, built as the worker builds it (`cluster.worker_stats.build_worker_stats`)."""
        engine_stats = self.sim.core.stats()
        on_device = set(engine_stats.device_adapters)
        host = sorted(k for k in self.host_cached if k not in on_device)
        worker = WorkerState(
            worker_id=self.worker_id,
            base_model=self.base_model,
            max_num_seqs=self.max_num_seqs,
            host_adapters=host,
            known_ranks={k: self.host_cached[k].rank for k in host if self.host_cached[k].rank > 0},
            num_active=self.num_fetching
            + len(self.sim.core.scheduler.running)
            + len(self.sim.core.scheduler.waiting),
            num_adapter_unloads=self.num_adapter_unloads,
            is_ready=self.is_ready,
            is_draining=self.is_draining,
        )
        return build_worker_stats(engine_stats, worker)

    def _state_key(self) -> tuple[object, ...]:
        """What the published state depends on: equal keys, equal stats."""
        return (
            self.sim.clock() if self.sim.is_busy else None,  # an idle worker's state does not change
            self.sim.executor.num_steps,
            len(self.sim.records),
            len(self.host_cached),
            self.num_fetching,
            self.num_adapter_unloads,
            self.is_ready,
            self.is_draining,
        )

    def _current_stats(self) -> WorkerStats:
        """`stats()`, built once per state (`_state_key`)."""
        key = self._state_key()
        if key != self._cache_key or self._stats is None:
            self._stats, self._record, self._cache_key = self.stats(), None, key
        return self._stats

    def record(self) -> WorkerRecord:
        """The heartbeat record (stats + a twin URL), rebuilt only when the worker's state changed."""
        stats = self._current_stats()
        if self._record is None:
            self._record = WorkerRecord.from_stats(stats, f"twin://{self.worker_id}")
        return self._record

    def view(self) -> WorkerView:
        """What the router reads of this worker: the one conversion, cluster/worker_view.py, of the stats a
        record carries (built without the record, which only placement and scaling read), rebuilt when
        `_view_structure_key` changed; otherwise only what changed is read again as the stats read it: the
        queues' signals when the core's queues changed (`scheduler_stats.queue_signals`), and the step-by-step
        numbers (`_with_step_numbers`); tests/twin/test_cluster_node.py holds it equal to a rebuilt view."""
        state = self._state_key()
        if state == self._view_state and self._view is not None:
            return self._view
        structure = self._view_structure_key()
        queues = self.sim.core.scheduler.version
        if self._view is None or structure != self._view_structure:
            view = worker_view(self._current_stats())
        else:
            view = self._with_step_numbers(self._view, queues != self._view_queues)
        self._view, self._view_state, self._view_structure, self._view_queues = view, state, structure, queues
        return view

    def _view_structure_key(self) -> tuple[object, ...]:
        """What the view reads besides the core's queues and its step-by-step numbers: its adapters'
        registration and device set (`AdapterResidency.version`), the host cache, the fetches and the
        lifecycle. Equal keys: views equal but for the queues' signals (`BatchScheduler.version`),
        `num_free_pool_pages` and the step medians."""
        return (
            self.sim.core.residency.version,
            len(self.host_cached),
            self.num_fetching,
            self.num_adapter_unloads,
            self.is_ready,
            self.is_draining,
        )

    def _with_step_numbers(self, view: WorkerView, is_queue_changed: bool) -> WorkerView:
        """`view` with the numbers that change step by step read as the stats read them (`make_stats`'
        num_free_pool_pages, `engine_stats`' decode and prefill step medians), and the queues' signals
        (`queue_signals`, what `make_stats` publishes) when the queues changed."""
        core = self.sim.core
        numbers = (
            core.scheduler.pool.num_free_pages,
            median_ms(core.counters.recent_decode_seconds),
            median_ms(core.counters.recent_prefill_seconds),
        )
        is_same = numbers == (view.num_free_pool_pages, view.decode_step_ms, view.prefill_step_ms)
        if is_same and not is_queue_changed:
            return view
        pages, decode_ms, prefill_ms = numbers
        view = with_fields(
            view, num_free_pool_pages=pages, decode_step_ms=decode_ms, prefill_step_ms=prefill_ms
        )
        return with_fields(view, **queue_signals(core.scheduler)) if is_queue_changed else view


def with_fields(view: WorkerView, **changes: object) -> WorkerView:
    """`dataclasses.replace(view, **changes)` without re-running the frozen `__init__` field by field (~6x
    faster): equal to it since every WorkerView field is an init field and it has no `__post_init__`
    (tests/twin/test_cluster_node.py holds both)."""
    copy = object.__new__(WorkerView)
    copy.__dict__.update(view.__dict__, **changes)
    return copy
