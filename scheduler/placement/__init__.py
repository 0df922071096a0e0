"""LoRAServe placement: which workers hold which adapters of a base model (pure: plain data in, a table out).

- `demand_forecast.py`: per-adapter demand (tokens/s), the max of an EWMA and the last bucket;
- `placement.py`: rank-bucketed fractional packing with a minimal-movement permutation;
- `replicated_placement.py`: holders per adapter following its demand (policy `replicated`);
- `placement_baselines.py`: the random and contiguous baselines it is compared with.
The periodic job is registry/placement_job.py; the table it publishes is cluster/placement_table.py's.
"""
