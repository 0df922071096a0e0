"""The capacity planner (torch-free): how many GPUs, which adapters on each and how big each adapter cache, to
serve a workload without starvation (and within a latency SLO), answered by a surrogate trained on the twin
and checked in the twin (../shared/papers/digital_twin.md, improved: per-GPU lengths as features, a latency
target, hot adapters split, and every plan re-run in the twin before it is returned).

Modules:
- workload.py: `Workload` (adapters with rank and rate, length percentiles), `load_workload`, `WorkloadError`.
- workload_trace.py: `generate_trace`, seeded Poisson arrivals of a workload's adapters.
- slo.py: `Slo`, `parse_slo` ("ttft_p99=2s").
- memory_check.py: `check_memory`, the analytic fit of adapter cache + minimum KV in a profile's memory.
- gpu_run.py: `GpuSetup`, `run_gpu`: one planned GPU in the twin (one `SimulatedWorker`) -> `GpuOutcome`.
- gpu_features.py: `gpu_features`, the surrogate's inputs for one GPU.
- surrogate.py: `Surrogate` (random forest + small tree), `training_samples` (twin runs, cached to a file).
- placement.py: first-fit decreasing with rollback, the latency variant, MaxBase and Random baselines.
- plan.py: `make_plan` (placement -> twin check -> fix until the twin agrees), `compare_baselines`.
- search_space.py: `Candidate` (workers, max_num_seqs, memory mode and split, batch policy, placement), `estimate`.
- cluster_check.py: `check_candidate`, one candidate in the cluster twin over a check window -> `CheckOutcome`
  (its verdict: meets SLO, misses SLO, or could not judge when the window holds no request; its margin).
- search.py: `search_plans`, the cheapest candidate meeting the SLO in the cluster twin within a budget.
"""
