"""Admission: which waiting requests an engine admits next, in what order (pure: plain data in, a plan out).

- `admission.py`: what a batch policy sees and returns (`WaitingRequest`, `BatchBudget`, `AdmissionPlan`);
- `batch_policy.py`: the policies by name (`engine_batch_policy`): FIFO and SJF baselines, and Chameleon's
  multi-queue policy (scheduler/multiqueue/);
- `fair_share.py`: the Virtual Token Counter fair share between tenants (Sheng et al., OSDI'24) around any policy;
- `running_budget.py`: the optional bounds on the running batch's tokens (`engine_max_running_tokens`) and on its
  distinct adapters' bytes (`engine_max_running_adapter_mib`);
- `external_release.py`: the same order applied to an engine that runs its own batches (the vLLM backend).
"""
