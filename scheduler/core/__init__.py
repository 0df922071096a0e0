"""The torch-free engine core: the engine (gpu_workers/engine/llm_engine.py) and the digital twin (twin/)
run this same code; only the executor differs (the model runner vs a cost model).

Modules:
- sampling.py: `SamplingParams` (per-request sampling, plain data).
- sequence.py: `Sequence` and `SequenceStatus` (one request's state), `BatchEntry` (its share of a step).
- page_pool.py: `PagePool`, one integer-only pool of device pages for KV blocks and adapter weights.
- adapter_residency.py: `AdapterResidency` (none/host/preparing/copying/device, pins, access statistics) over
  the pool; eviction order from an `EvictionPolicy` (scheduler/cache/eviction.py: lru, chameleon, fastlibra);
  adapter_state.py: its plain data (`Residency`, `AdapterState`).
- prefix_cache.py: `PrefixCache`, prefix KV blocks per namespace and adapter (root -> (namespace, adapter) ->
  blocks), ref-counted, LRU leaf eviction, dropped with their adapter.
- byte_budget_lru.py: `ByteBudgetLRU`, keys with sizes in LRU order evicted down to a byte budget (pins stay);
  under host_tier.py (`HostTier`, the packed host copies) and the worker's host file cache.
- step_plan.py: `StepPlan` (entries, adapter loads, adapter evictions, preemptions), `AdapterLoad`.
- batch_scheduler.py: `BatchScheduler.schedule()` -> StepPlan, admission order from a `BatchPolicy`
  (scheduler/admission/batch_policy.py), then prefetch of waiting requests' adapters.
- step_output.py: `update_from_output` (`BatchScheduler.update_from_output`), the update after a step: computed
  and sampled tokens, stop token / EOS / length stops, first-scheduled / first-token / finish times.
- scheduler_stats.py: `SchedulerStats`, the core's counters and the router's inputs
  (`BatchScheduler.make_stats()`), a worker's stats' `scheduler` part (cluster/protocol.py `WorkerStats`).
- engine_stats.py: `EngineStats`, what `EngineCore.stats()` returns (SchedulerStats, the core's counters and
  the executor's typed `ExecutorStats`).
- copy_gate.py: `CopyGate`, which sequences of an adapter still being loaded run this step (CPU-assisted
  prefills) and which wait for its preparation or its copy.
- admission_gate.py: `AdmissionGate`, which planned requests a memory shortfall blocks (all, the group's, or
  the group's except its bypass ids).

Imports: none of this project's modules outside `scheduler`, and no torch/numpy/safetensors/DB/HTTP (import-linter).
"""
