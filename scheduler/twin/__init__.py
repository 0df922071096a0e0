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
- profiles/: shipped profiles (GPUs from published measurements, this project's CPU engine measured).

Imports: `scheduler` only (no torch, no gpu_workers/api; import-linter).
"""
