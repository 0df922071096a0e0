"""The digital twin (torch-free): one worker is the real `scheduler.core` with a simulated executor whose step
times come from a cost model; profiles are files.

Modules:
- step_shape.py: `StepShape`, one engine step's work (prefill tokens and attention, decode rows and context,
  LoRA token x rank pairs, distinct adapters, CPU-assisted tokens), built from the core's `BatchEntry`s.
- profile.py: `TwinProfile`, the profile file (hardware, model shape, step coefficients, copy link, memory,
  a source per constant); `load_profile` / `save_profile` (JSON or YAML), `ProfileError`.
- cost_model.py: `CostModel(profile)`: `step_seconds(shape)`, `copy_seconds(num_bytes)`.
- fit.py: `fit_step_cost`, non-negative least squares of the step coefficients on timed steps (what
  `lorahost profile --twin-output` runs).
- worker_sim.py: `SimulatedWorker`, one worker (the core over a `SimulatedExecutor`, one `SimClock`).
- cluster_node.py: `ClusterNode`, a simulated worker process: lifecycle, host cache and fetches, drops, and
  its published `WorkerStats` (built as the worker builds them; the router reads `worker_view` of them).
- usage_history.py: the placement job's usage history from request records.
- cluster_sim.py: `ClusterSim` / `simulate_cluster`: N workers behind the real router, placement job (pure
  half, cluster/placement_table.py), scaling decision and scale plan, cold starts and the front-door hold.
- planner/: the capacity planner (a surrogate trained on worker runs, first-fit decreasing placement, every plan
  re-checked here): `lorahost plan`, POST /v1/admin/plan.
- profiles/: shipped profiles (GPUs from published measurements, this project's CPU engine measured).

Imports: `scheduler`, `settings` and the pure `cluster` modules only (no torch, no gpu_workers/api/registry;
import-linter).
"""
