"""Scaling: how many workers (and which base models) run, and what they hold in memory (pure, no I/O).

- `scaling.py`: the desired worker count of a base model (LoRAServe's capacity model, cooldown, scale to zero);
- `scale_plan.py`: how a scaler acts on a desired count (which workers to start and stop);
- `model_pool.py`: which base models an embedded server keeps loaded within a memory budget;
- `worker_footprint.py`: one worker's memory and the pool sizes that fit what is left of a budget.
"""
