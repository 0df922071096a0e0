"""The cluster twin: N simulated workers (twin/cluster_node.py, each the engine's own core over a
cost model, with its own `SimClock`) behind the platform's real routing, placement and scaling code, driven
by one discrete-event loop in simulated time. Same settings object as production (`settings.Settings`).

Events, in time order (ties: worker ready, placement, scaling, fetch landed, held request's poll, arrival):
- before any event at time t every worker is stepped until its clock reaches t (`step_until`: a step in
  flight ends past t, as the engine's stats wait for the current step);
- arrival / held request's poll: the router (`make_router(settings.routing.policy, options)`, as
  api/services.py builds it) chooses among the workers' views, each built from its core's stats exactly as
  the worker publishes them (`WorkerStats` -> `cluster.worker_view.worker_view`), with the adapter's
  routing-table row as `assigned_workers` (api/inference/prepare.py `with_placement`). No ready worker: the
  request waits at the front door (api/cold_start.py): it re-routes every `settings.api.cold_start_poll_interval_s`
  once a worker is ready, and is refused after `settings.api.cold_start_timeout_s` (error_code
  "cold_start_timeout", no worker);
- routed to a worker without the adapter's files: the worker fetches them (`adapter_fetch_s`) before the
  engine sees the request (cluster/protocol.py: the fetch delays the stream; it counts in TTFT); a
  second request for the same adapter waits for the same fetch;
- placement, every `settings.jobs.placement_interval_s` (0: never): the placement job's pure half
  (cluster/placement_table.py `build_table` over the usage history of the twin's records,
  twin/usage_history.py), published to a real `InMemoryRoutingTableStore`; then its drops
  (`drop_unassigned`: device copies unloaded unless in use). Workers pull adapters on their first request,
  as in production (no prefetch);
- scaling, every `scaling_interval_s` (the dev-cluster scaler's poll, scheduler/scaling/scale_plan.py), when
  `is_autoscaling`: `decide_scaling` on `cluster.model_load.model_loads` (published demand, live workers,
  front-door waiters), applied by `plan_scaling` (start new workers; drain the newest). A new worker is
  routable `cold_start_s` after it starts, with no adapter anywhere; a draining worker takes no request
  and stops once idle.
Approximations: views are fresh at every decision (production reads heartbeats up to
`worker.heartbeat_interval_s` + `routing.worker_view_cache_s` old, and the routing table up to
`routing.table_refresh_s` old); one base model (`settings.base_model_name`); workers never refuse (no
overloaded/draining retry); usage counts completion tokens as produced.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from cluster.model_load import model_loads, scaling_policy
from cluster.placement_table import VersionInfo, build_table, drop_unassigned, num_history_buckets
from cluster.routing_table import InMemoryRoutingTableStore
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.routing.router import RouteRequest, RouterOptions
from scheduler.routing.router_policies import make_router
from scheduler.scaling.scale_plan import plan_scaling
from scheduler.scaling.scaling import decide_scaling
from settings import Settings
from twin.cluster_node import ClusterNode
from twin.cluster_run import ClusterOptions, ClusterResult, WorkerCountSample, WorkerSummary
from twin.cost_model import CostModel
from twin.event_queue import EventKind, EventQueue
from twin.front_door import HeldRequest, next_poll_s
from twin.profile import TwinProfile
from twin.request_record import RequestRecord
from twin.sim_clock import SimClock
from twin.trace import AdapterSpec, TraceRequest
from twin.usage_history import usage_history
from twin.worker_sim import SimulatedWorker

COLD_START_TIMEOUT_CODE = "cold_start_timeout"


_Payload = TraceRequest | str | ClusterNode | tuple[ClusterNode, TraceRequest] | None


class ClusterSim:
    """One run of the cluster twin (module doc): `run(trace)` once."""

    def __init__(
        self,
        settings: Settings,
        geometry: MemoryGeometry,
        cost_model: CostModel,
        adapters: Sequence[AdapterSpec],
        options: ClusterOptions | None = None,
    ) -> None:
        self.settings = settings
        self.geometry = geometry
        self.cost_model = cost_model
        self.adapters = {a.adapter_id: a for a in adapters}
        self.options = options = options or ClusterOptions()
        self.base_model = settings.base_model_name
        self.router = make_router(
            settings.routing.policy,
            RouterOptions(
                slo_tpot_ms=settings.routing.slo_tpot_ms,
                cold_fetch_ms=settings.routing.cold_fetch_ms,
                max_load_gap=settings.routing.max_load_gap,
            ),
        )
        self.policy = scaling_policy(settings)
        self.store = InMemoryRoutingTableStore()
        self.nodes: dict[str, ClusterNode] = {}
        self.held: dict[str, HeldRequest] = {}
        self.refused: dict[str, RequestRecord] = {}
        self.result = ClusterResult([], [], [])
        self._events: EventQueue[_Payload] = EventQueue()
        self._num_pending = 0  # arrivals not yet processed plus fetches not landed
        self._usage: list[RequestRecord] = []  # records the placement history may still count
        self._wait_start: dict[str, float] = {}  # held requests' first wait (their cold-start deadline)
        self._fetch_s = (
            options.adapter_fetch_s
            if options.adapter_fetch_s is not None
            else settings.routing.cold_fetch_ms / 1000
        )

    # ---- the loop ---------------------------------------------------------------------------------------

    def run(self, trace: Sequence[TraceRequest]) -> ClusterResult:
        """Simulate `trace` to the last finish; records in trace order."""
        wall_start = time.perf_counter()
        for _ in range(self.options.num_initial_workers):
            self._start_node(0.0).ready_s = 0.0
        self._sample(0.0)
        for request in trace:
            self._events.push(request.arrival_s, EventKind.ARRIVAL, request)
        self._num_pending = len(trace)
        if self.settings.jobs.placement_interval_s > 0:
            self._events.push(self.settings.jobs.placement_interval_s, EventKind.PLACEMENT, None)
        if self.options.is_autoscaling:
            self._events.push(self.options.scaling_interval_s, EventKind.SCALING, None)
        while self._events and (self._num_pending or self.held):
            moment, kind, payload = self._events.pop()
            self._advance(moment)
            self._handle(moment, kind, payload)
        end = self._drain_all()
        self.result.records = [self._record_of(r.request_id) for r in trace]
        self.result.simulated_s = end - min((r.arrival_s for r in trace), default=0.0)
        self.result.wall_s = time.perf_counter() - wall_start
        self.result.workers = [self._summary(n) for n in self.nodes.values()]
        return self.result

    def _advance(self, moment: float) -> None:
        for node in self._running_nodes():
            node.sim.step_until(moment)
        self._retire_idle_draining(moment)

    def _handle(self, moment: float, kind: EventKind, payload: _Payload) -> None:
        if kind is EventKind.ARRIVAL:
            assert isinstance(payload, TraceRequest)
            self._num_pending -= 1
            self._route(payload, moment)
        elif kind is EventKind.POLL:
            assert isinstance(payload, str)
            if payload in self.held:
                self._route(self.held.pop(payload).request, moment)
        elif kind is EventKind.TIMEOUT:
            assert isinstance(payload, str)
            if payload in self.held:
                self._refuse(self.held.pop(payload).request, moment)
        elif kind is EventKind.FETCHED:
            assert isinstance(payload, tuple)
            node, request = payload
            self._land(node, request, moment)
        elif kind is EventKind.READY:
            assert isinstance(payload, ClusterNode)
            self._on_ready(payload, moment)
        elif kind is EventKind.PLACEMENT:
            self._place(moment)
            self._events.push(moment + self.settings.jobs.placement_interval_s, EventKind.PLACEMENT, None)
        else:
            self._scale(moment)
            self._events.push(moment + self.options.scaling_interval_s, EventKind.SCALING, None)

    def _drain_all(self) -> float:
        """Run every worker until idle; the time the last one finished."""
        end = 0.0
        for node in self._running_nodes():
            while node.sim.is_busy:
                node.sim.step()
            end = max(end, node.sim.clock())
        finishes = [r.finish_s for n in self.nodes.values() for r in n.sim.records.values() if r.finish_s]
        return max([end, *finishes, *(r.arrival_s for r in self.refused.values())])

    # ---- routing and the front door -----------------------------------------------------------------------

    def _route(self, request: TraceRequest, moment: float) -> None:
        """Route now, or hold at the front door (its deadline counts from its first wait)."""
        views = [n.view() for n in self._running_nodes()]
        chosen = self.router.choose(self._route_request(request), views)
        if chosen is None:
            if request.request_id not in self._wait_start:
                self._wait_start[request.request_id] = moment
                self._events.push(
                    moment + self.settings.api.cold_start_timeout_s, EventKind.TIMEOUT, request.request_id
                )
            self._hold(request, moment)
            return
        self._wait_start.pop(request.request_id, None)
        self._dispatch(self.nodes[chosen], request, moment)

    def _route_request(self, request: TraceRequest) -> RouteRequest:
        adapter = self.adapters.get(request.adapter_id) if request.adapter_id is not None else None
        table = self.store.read()
        row = table.rows.get(request.adapter_id, ()) if table and request.adapter_id else ()
        predicted = request.predicted_output_tokens
        return RouteRequest(
            self.base_model,
            request.adapter_id,
            request.num_prompt_tokens,
            predicted_output_tokens=predicted if predicted is not None else request.num_output_tokens,
            adapter_rank=adapter.rank if adapter else 0,
            assigned_workers=row,
            tenant_id=request.tenant_id,
        )

    def _hold(self, request: TraceRequest, moment: float) -> None:
        """Wait at the front door; polls are scheduled once a worker is ready (here or in `_on_ready`)."""
        held = self.held[request.request_id] = HeldRequest(request, self._wait_start[request.request_id])
        if any(n.is_ready for n in self.nodes.values()):
            self._schedule_poll(held, moment, strictly_after=True)

    def _schedule_poll(self, held: HeldRequest, moment: float, strictly_after: bool = False) -> None:
        poll_s = next_poll_s(held, moment, self.settings.api.cold_start_poll_interval_s, strictly_after)
        self._events.push(poll_s, EventKind.POLL, held.request.request_id)

    def _refuse(self, request: TraceRequest, moment: float) -> None:
        self._wait_start.pop(request.request_id, None)
        self.refused[request.request_id] = RequestRecord(
            request.request_id,
            request.arrival_s,
            request.num_prompt_tokens,
            adapter_id=request.adapter_id,
            tenant_id=request.tenant_id,
            finish_s=moment,
            finish_reason="error",
            error_code=COLD_START_TIMEOUT_CODE,
        )

    def _dispatch(self, node: ClusterNode, request: TraceRequest, moment: float) -> None:
        """Give the request to the worker; first fetch its adapter's files when the worker has none."""
        key = request.adapter_id
        if key is None or key in node.host_cached:
            self._submit(node, request, moment)
            return
        if key not in node.fetch_done_at:
            if self._fetch_s <= 0:
                node.land_fetch(self.adapters[key])
                self._submit(node, request, moment)
                return
            node.fetch_done_at[key] = moment + self._fetch_s
        node.num_fetching += 1
        self._num_pending += 1
        self._events.push(node.fetch_done_at[key], EventKind.FETCHED, (node, request))

    def _land(self, node: ClusterNode, request: TraceRequest, moment: float) -> None:
        assert request.adapter_id is not None
        node.num_fetching -= 1
        self._num_pending -= 1
        node.land_fetch(self.adapters[request.adapter_id])
        self._submit(node, request, moment)

    def _submit(self, node: ClusterNode, request: TraceRequest, moment: float) -> None:
        node.submit(request, moment)
        self._usage.append(node.sim.records[request.request_id])

    # ---- placement --------------------------------------------------------------------------------------

    def _place(self, moment: float) -> None:
        """One run of the placement job at `moment` (registry/placement_job.py `run_placement`'s pure half)."""
        settings = self.settings
        num_buckets = num_history_buckets(settings)
        window_start = moment - num_buckets * settings.placement.bucket_s
        self._usage = [r for r in self._usage if r.arrival_s >= window_start]
        history = usage_history(
            self._usage, moment, settings.placement.bucket_s, num_buckets, self.base_model
        )
        previous = self.store.read()
        keys = set(history.adapter_tokens) | set(previous.rows if previous else ())
        versions = {
            k: VersionInfo(self.base_model, self.adapters[k].rank) for k in sorted(keys) if k in self.adapters
        }
        records = [n.record() for n in self._running_nodes() if n.is_ready]
        table = build_table(
            history, versions, records, previous, settings, datetime.fromtimestamp(moment, UTC)
        )
        published = self.store.publish(table)
        self.result.routing_tables.append(published)
        drop_unassigned(
            records, published, previous, lambda record, key: self.nodes[record.worker_id].drop(key)
        )

    # ---- scaling ----------------------------------------------------------------------------------------

    def _scale(self, moment: float) -> None:
        """One autoscaler poll: the decision (cluster/model_load.py + decide_scaling), applied (plan_scaling)."""
        records = [n.record() for n in self._running_nodes()]
        waiting = {self.base_model: len(self.held)} if self.held else {}
        loads = model_loads(self.store.read(), records, waiting, moment, (self.base_model,))
        [decision] = [
            decide_scaling(load, self.policy) for load in loads if load.base_model == self.base_model
        ]
        self.result.scaling_decisions.append((moment, decision))
        managed = [n.worker_id for n in self._running_nodes() if not n.is_draining]
        plan = plan_scaling(decision.desired_workers, managed, self.settings.scaling.max_workers)
        if plan.is_noop:
            return
        for _ in range(plan.num_to_start):
            self._events.push(moment + self.options.cold_start_s, EventKind.READY, self._start_node(moment))
        for worker_id in plan.stop_ids:
            self._stop(self.nodes[worker_id], moment)
        self._sample(moment)

    def _start_node(self, moment: float) -> ClusterNode:
        worker_id = f"twin-{len(self.nodes):03d}"
        sim = SimulatedWorker(
            self.settings.engine,
            self.geometry,
            self.cost_model,
            max_lora_rank=self.settings.resolved_max_lora_rank(),  # what production's workers publish
            worker_id=worker_id,
            clock=SimClock(moment),
        )
        node = ClusterNode(sim, self.base_model, self.settings.engine.max_num_seqs, moment)
        self.nodes[worker_id] = node
        return node

    def _stop(self, node: ClusterNode, moment: float) -> None:
        """SIGTERM: a starting worker just goes; a ready one drains (no new requests) and stops when idle."""
        node.is_draining = True
        if node.ready_s is None or not node.is_busy:
            node.stopped_s = moment

    def _on_ready(self, node: ClusterNode, moment: float) -> None:
        if node.stopped_s is not None:
            return
        node.ready_s = moment
        self._sample(moment)
        for held in self.held.values():
            self._schedule_poll(held, moment)

    def _retire_idle_draining(self, moment: float) -> None:
        retired = [n for n in self._running_nodes() if n.is_draining and not n.is_busy]
        for node in retired:
            node.stopped_s = max(moment, node.sim.clock())
        if retired:
            self._sample(moment)

    # ---- outputs ----------------------------------------------------------------------------------------

    def _running_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes.values() if n.stopped_s is None]

    def _sample(self, moment: float) -> None:
        nodes = self._running_nodes()
        sample = WorkerCountSample(
            moment,
            num_ready=sum(1 for n in nodes if n.is_ready),
            num_starting=sum(1 for n in nodes if n.ready_s is None),
            num_draining=sum(1 for n in nodes if n.is_draining),
        )
        counts = self.result.worker_counts
        if counts and counts[-1].time_s == moment:
            counts.pop()
        if not counts or dataclasses.replace(counts[-1], time_s=moment) != sample:
            counts.append(sample)

    def _record_of(self, request_id: str) -> RequestRecord:
        for node in self.nodes.values():
            if request_id in node.sim.records:
                return node.sim.records[request_id]
        return self.refused[request_id]

    @staticmethod
    def _summary(node: ClusterNode) -> WorkerSummary:
        return WorkerSummary(
            node.worker_id, node.started_s, node.ready_s, node.stopped_s, len(node.sim.records), node.stats()
        )


def simulate_cluster(
    trace: Sequence[TraceRequest],
    adapters: Sequence[AdapterSpec],
    settings: Settings,
    profile: TwinProfile | CostModel,
    *,
    geometry: MemoryGeometry | None = None,
    options: ClusterOptions | None = None,
) -> ClusterResult:
    """Simulate `trace` on a cluster of workers with `profile`'s step costs and `geometry`'s memory (default:
    the profile's device memory paged in the engine settings' memory mode; module doc); what a benchmark or
    the planner calls."""
    cost_model = profile if isinstance(profile, CostModel) else CostModel(profile)
    if geometry is None:
        engine = settings.engine
        geometry = cost_model.profile.geometry(
            engine.memory_mode,
            adapter_cache_bytes=engine.adapter_cache_bytes,
            max_lora_rank=settings.resolved_max_lora_rank(),
            max_model_len=engine.max_model_len,
        )
    return ClusterSim(settings, geometry, cost_model, adapters, options).run(trace)
