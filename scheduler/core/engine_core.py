"""EngineCore: one engine's step loop over an `Executor`, torch-free, shared by the native engine
(gpu_workers/engine/llm_engine.py, whose executor is the torch `ModelRunner`) and the digital twin
(twin/, whose executor is simulated).

It owns the page pool (sized from the executor's `MemoryGeometry`), the adapter residency, the prefix cache
and the `BatchScheduler`. Each `step()`: report the adapter host copies that became ready and the copies that
landed, `schedule()`, carry out the plan's adapter side on the executor (drop evicted device copies, copy
the KV pages moved out of new adapters' runs, start planned loads), run the runnable entries, hand the
sampled tokens to `BatchScheduler.update_from_output`, count the step. A planned load runs off the step loop in two stages, both on the executor's threads: its
host copy is prepared (files read, validated, packed; the adapter is PREPARING and its requests wait while
every other request keeps stepping), then copied (COPYING: CPU-assisted prefill on the host copy). The
step loop never waits on a cold adapter, except an idle step that has nothing else to run (at most
`COPY_WAIT_SECONDS`). A planned load that fails at either stage ends that adapter's requests with
error_code "adapter_unavailable" (counted once); a row without a token (non-finite logits) ends alone with
"numeric_overflow". Every sequence that produced a token, finished or failed
comes back as a `SeqDelta`, in the order it happened; the caller (the engine) turns them into outputs.

Multi-step (`CoreLimits.num_scheduler_steps`, scheduler/core/multi_step.py): `schedule()` may return the same
plan of decodes for several steps (a window); `step()` still runs one engine step per call unless given a
`horizon` (a simulation's next event), when it goes on to the horizon, running the window's steps in one
executor call where the executor can (`DecodeStepsExecutor`, the twin's) and no token can end a row early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from scheduler.admission.admission import BatchPolicy
from scheduler.cache.eviction import EvictionPolicy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.engine_counters import EngineCounters
from scheduler.core.engine_stats import EngineStats, engine_stats
from scheduler.core.executor import DecodeStepsExecutor, Executor, PrepareResult
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.multi_step import are_finishes_known, num_steps_with_pages
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.sequence import Sequence
from scheduler.core.step_output import TextStop, update_from_decode_steps
from scheduler.core.step_plan import StepPlan

COPY_WAIT_SECONDS = 0.005  # longest an idle step blocks on an adapter load (new requests wait that long)


@dataclass(frozen=True)
class SeqDelta:
    """A sequence that changed in a step: its new tokens (none when it finished, failed or was aborted; several
    from a multi-step window run at once) and `token_times`, the core's clock when each token's step ended."""

    seq: Sequence
    new_token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class CoreLimits:
    """The engine core's scheduling limits and switches (the engine settings' values)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool = True
    num_cpu_prefill_workers: int = 0
    is_caching_idle_adapters: bool = True
    max_running_tokens: int | None = (
        None  # the running batch's token bound (scheduler/admission/running_budget.py)
    )
    num_scheduler_steps: int = 1  # engine steps one plan of decodes may run (scheduler/core/multi_step.py)
    max_running_adapter_bytes: int | None = None  # the running batch's bound on its distinct adapters' bytes
    max_compaction_pages: int = 0  # KV pages one adapter load may move out of its run (unified pool; 0: none)


class EngineCore:
    """The step loop of one engine over an executor (module doc)."""

    def __init__(
        self,
        executor: Executor,
        policy: BatchPolicy,
        limits: CoreLimits,
        *,
        eviction_policy: EvictionPolicy | None = None,
        eos_token_ids: Collection[int] = frozenset(),
        clock: Callable[[], float] = time.time,
        step_timer: Callable[[], float] = time.perf_counter,
        text_stop: TextStop | None = None,
    ) -> None:
        """`clock` stamps request times and ages (the scheduler's and the residency's clock); `step_timer`
        times steps (a simulation passes its clock to both); `text_stop` is called for every appended token
        (the engine's stop strings)."""
        self.executor = executor
        self.geometry: MemoryGeometry = executor.geometry
        self.clock = clock
        self.step_timer = step_timer
        self.text_stop = text_stop
        geometry = self.geometry
        self.pool = PagePool(geometry.num_pool_pages, geometry.block_size, geometry.num_kv_blocks)
        self.residency = AdapterResidency(
            self.pool,
            geometry.kv_bytes_per_block,
            policy=eviction_policy,
            clock=clock,
            is_caching_idle_adapters=limits.is_caching_idle_adapters,
            max_compaction_pages=limits.max_compaction_pages,
        )
        self.prefix_cache = PrefixCache(self.pool) if limits.enable_prefix_caching else None
        self.scheduler = BatchScheduler(
            self.pool,
            self.residency,
            policy,
            limits.max_num_seqs,
            limits.max_num_batched_tokens,
            prefix_cache=self.prefix_cache,
            num_cpu_prefill_workers=limits.num_cpu_prefill_workers,
            clock=clock,
            eos_token_ids=eos_token_ids,
            max_running_tokens=limits.max_running_tokens,
            max_num_steps=limits.num_scheduler_steps,
            max_running_adapter_bytes=limits.max_running_adapter_bytes,
        )
        self.counters = EngineCounters()
        self._pending: list[SeqDelta] = []
        # an executor that runs a window's steps in one call (the twin's; scheduler/core/multi_step.py)
        self._decode_steps = executor if isinstance(executor, DecodeStepsExecutor) else None
        self._known_finishes: tuple[StepPlan | None, bool] = (None, False)  # per window plan

    # ---- requests -----------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (the caller checked its id, prompt and adapter)."""
        self.scheduler.add(seq)
        self.counters.num_prompt_tokens += seq.num_prompt_tokens

    def abort(self, request_id: str) -> bool:
        """Finish a request now (reason "abort"), freeing its pages; False if it is not in the engine."""
        seq = self.scheduler.get(request_id)
        if seq is None:
            return False
        # counted before the sequence leaves the running set: a reader on another thread that sees it gone sees it counted
        self.counters.num_aborted += 1
        self.finish(seq, "abort")
        self._pending.append(SeqDelta(seq))
        return True

    def fail(self, seq: Sequence, error: str, code: str) -> None:
        """Finish one request with reason "error" and an error code (its batch neighbours are not affected)."""
        seq.error, seq.error_code = error, code
        self.finish(seq, "error")

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence now with `reason`, free its pages and release it from the executor."""
        seq.finish_time = self.clock()
        self.scheduler.finish(seq, reason)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """A finished sequence leaves the executor (its per-request state) and is counted."""
        self.executor.release_request(seq.request_id)
        self.counters.num_finished += 1

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return self.scheduler.has_unfinished()

    def has_pending_deltas(self) -> bool:
        """True while deltas of finished requests (aborts, failed copies) wait for the next `step()`."""
        return bool(self._pending)

    # ---- stepping -----------------------------------------------------------------------------------

    def step(self, horizon: float | None = None) -> list[SeqDelta]:
        """Run one batch; return a delta for every sequence that produced a token, finished or failed.

        `horizon` (a simulation, which knows its next event): go on stepping while a multi-step window is
        open (scheduler/core/multi_step.py) and `step_timer()` is before it; the steps are those that one call
        per step would run until the timer reaches the horizon, and each delta carries its step's end time."""
        deltas: list[SeqDelta] = []
        while True:
            batch = self._run_window_steps(horizon) if horizon is not None else None
            deltas += batch if batch is not None else self._step_once()
            if horizon is None or not self.scheduler.window.is_open or self.step_timer() >= horizon:
                return deltas

    def _run_window_steps(self, horizon: float) -> list[SeqDelta] | None:
        """Run the open window's next steps in one executor call, up to `horizon` (scheduler/core/multi_step.py);
        None when the executor cannot, a token could end a row early or no step's pages are free."""
        executor = self._decode_steps
        if executor is None or not self.scheduler.window.is_open:
            return None
        self.poll_copies()  # what one step would hear first (a report closes the window)
        plan, running = self.scheduler.window.plan, self.scheduler.running
        if plan is None or self._pending:
            return None
        entries = plan.runnable_entries()
        if self._known_finishes[0] is not plan:  # once per window
            known = are_finishes_known(entries, self.scheduler.eos_token_ids, self.text_stop is not None)
            self._known_finishes = (plan, known)
        if not self._known_finishes[1]:
            return None
        max_steps = num_steps_with_pages(running, self.pool, self.scheduler.window.num_steps_left)
        if max_steps == 0:
            return None
        started = self.step_timer()
        out = executor.run_decode_steps(entries, max_steps, horizon)
        ends = out.end_times
        starts = [started, *ends[:-1]]
        self.scheduler.advance_window(starts)
        for seq in update_from_decode_steps(entries, out.tokens, ends[-1], self.scheduler.finish):
            self._release(seq)
        self.counters.record_decode_steps(len(entries), [end - start for start, end in zip(starts, ends)])
        deltas = [SeqDelta(e.seq, row, ends) for e, row in zip(entries, out.tokens)]
        self.poll_copies()
        return deltas

    def _step_once(self) -> list[SeqDelta]:
        self.poll_copies()
        plan = self.scheduler.schedule()
        self._carry_out(plan)
        entries = plan.runnable_entries()  # a failed adapter load ends its requests
        if not entries:
            if plan.copy_waits and self.executor.has_copies_in_flight():
                self.executor.wait_for_copy(COPY_WAIT_SECONDS)  # nothing else to run: let the load go on
                self.poll_copies()
            return self._take_pending()
        started = self.step_timer()
        host_assisted = plan.host_assisted_adapters
        if host_assisted:
            host_assisted = host_assisted & {e.seq.adapter_id for e in entries}
        tokens = self.executor.run_step(entries, host_assisted)
        deltas = self._take_pending() + self._process(plan, tokens)
        num_sampled = sum(t is not None for t in tokens)
        self.counters.record_step(entries, num_sampled, self.step_timer() - started)
        self.poll_copies()
        return deltas + self._take_pending()

    def _take_pending(self) -> list[SeqDelta]:
        pending, self._pending = self._pending, []
        return pending

    def _process(self, plan: StepPlan, tokens: list[int | None]) -> list[SeqDelta]:
        """Hand the sampled tokens to the core (stops, times), fail the rows without a token, build deltas."""
        now = self.clock()
        update = self.scheduler.update_from_output(plan, tokens, now, text_stop=self.text_stop)
        for seq in update.finished:
            self._release(seq)
        deltas = []
        for row in update.sampled:
            if row.token_id is None:
                self.fail(row.seq, overflow_message(row.seq), "numeric_overflow")
                deltas.append(SeqDelta(row.seq))
            else:
                deltas.append(SeqDelta(row.seq, [row.token_id], [now]))
        return deltas

    # ---- adapter loads ------------------------------------------------------------------------------

    def _carry_out(self, plan: StepPlan) -> None:
        """Drop evicted device copies, copy the KV pages moved out of new adapters' runs, then start the planned
        loads (their stages end in `poll_copies`); a load that cannot start fails its adapter's requests."""
        for adapter_id in plan.adapter_evictions:
            self.executor.drop_adapter(adapter_id)
        if plan.kv_block_moves:
            self.executor.move_kv_blocks(plan.kv_block_moves)
            self.counters.record_kv_block_moves(len(plan.kv_block_moves))
        for load in plan.adapter_loads:
            try:
                self.executor.start_adapter_copy(
                    load.adapter_id, load.host_path, self.page_ids(load.adapter_id)
                )
            except Exception as exc:  # noqa: BLE001 (the load could not start: fail its requests only)
                self.counters.num_adapter_copy_failures += 1
                self.fail_adapter(load.adapter_id, str(exc))

    def poll_copies(self) -> None:
        """Report the host copies that became ready (their prefills may run on them from now on) and the
        copies that landed (their sequences use the device copy from now on) to the core; fail the requests
        of the loads that failed."""
        for prepared in self.executor.take_prepared_copies():
            self._on_prepared(prepared)
        for result in self.executor.take_finished_copies():
            if self.residency.residency(result.adapter_id) is not Residency.COPYING:
                continue  # replaced meanwhile (an explicit load)
            if result.error is None:
                self.scheduler.on_adapter_loaded(result.adapter_id, result.seconds)
            else:
                self.counters.num_adapter_copy_failures += 1
                self.fail_adapter(result.adapter_id, f"copy to the device failed: {result.error}")

    def _on_prepared(self, result: PrepareResult) -> None:
        """A planned load's host copy is ready (PREPARING -> COPYING), or could not be made (its requests
        fail)."""
        if self.residency.residency(result.adapter_id) is not Residency.PREPARING:
            return  # replaced meanwhile (an explicit load)
        if result.error is not None:
            self.counters.num_adapter_prepare_failures += 1
            self.fail_adapter(result.adapter_id, result.error)
            return
        if not result.is_from_host_tier:
            self.counters.record_preparation(result.seconds)
        self.scheduler.on_adapter_prepared(result.adapter_id)

    def fail_adapter(self, adapter_id: str, reason: str) -> None:
        """A planned load failed (files changed or vanished after they were verified, or the link failed):
        end that adapter's requests only, with error_code "adapter_unavailable" (one load failure; the
        caller counts the stage that failed)."""
        self.counters.num_adapter_load_failures += 1
        for seq in self.scheduler.on_adapter_load_failed(adapter_id):
            message = f"adapter {adapter_id!r} could not be loaded from its host copy: {reason}"
            self.fail(seq, message, "adapter_unavailable")
            self._pending.append(SeqDelta(seq))

    # ---- introspection ------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """The scheduler's stats, counts and step timings, the memory geometry and the executor's own stats
        (typed; the routing signals of a worker; scheduler/core/engine_stats.py)."""
        return engine_stats(
            self.scheduler.make_stats(),
            self.counters,
            self.executor.stats(),
            memory_mode=self.geometry.memory_mode,
            max_model_len=self.geometry.max_model_len,
        )

    def page_ids(self, adapter_id: str) -> list[int]:
        """The pages the core reserved for an adapter (views of the KV cache in a unified pool)."""
        state = self.residency.get(adapter_id)
        return list(state.page_ids) if state is not None else []


def overflow_message(seq: Sequence) -> str:
    """What a tenant reads when its request's logits went non-finite."""
    if seq.adapter_id is None:
        return (
            f"request {seq.request_id!r} was stopped: the base model produced non-finite logits (numeric "
            "overflow) for this prompt; shorten or change the prompt"
        )
    return (
        f"request {seq.request_id!r} was stopped: adapter {seq.adapter_id!r} produced non-finite logits "
        "(numeric overflow in its weights); retrain or rescale it with smaller lora_B/lora_A values or a "
        "smaller lora_alpha, upload it again, and retry"
    )
