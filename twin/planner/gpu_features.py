"""`gpu_features`: the surrogate's inputs for one GPU: the paper's (number of adapters, sum and std of rates,
max/mean/std of adapter sizes and ranks, adapter cache size) plus the workload's mean prompt and output
lengths, the offered token rate and `load`, the offered requests over a rough analytic capacity of the GPU
(`capacity_req_s`: full-batch decode steps plus prefill per request), so one model serves workloads of
different lengths and finds the starvation boundary with few samples; and `cache_fraction`, the adapter cache
over the pool bytes of all the GPU's adapters (below 1 adapters are evicted and copied back, and in the twin a
cold adapter's long prompt prefilled on the host can starve a GPU at any load)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from settings.engine import EngineSettings
from twin.planner.memory_check import adapter_cache_bytes, adapter_device_bytes
from twin.planner.workload import PlannedAdapter, Workload
from twin.profile import TwinProfile

FEATURE_NAMES = (
    "num_adapters",
    "rate_sum",
    "rate_std",
    "size_max_mb",
    "size_mean_mb",
    "size_std_mb",
    "rank_max",
    "rank_mean",
    "rank_std",
    "cache_mb",
    "prompt_mean",
    "output_mean",
    "offered_tok_s",
    "load",
    "cache_fraction",
)


def capacity_req_s(
    profile: TwinProfile, engine: EngineSettings, prompt_mean: float, output_mean: float
) -> float:
    """Rough requests/s one GPU serves: `max_num_seqs`-row decode steps plus each request's prefill tokens."""
    step = profile.step
    full_step_s = (step.fixed_us + step.per_decode_seq_us * engine.max_num_seqs) / 1e6
    per_request_s = (
        output_mean * full_step_s / engine.max_num_seqs + prompt_mean * step.per_prefill_token_us / 1e6
    )
    return 1.0 / max(per_request_s, 1e-9)


def gpu_features(
    profile: TwinProfile,
    engine: EngineSettings,
    workload: Workload,
    adapters: Sequence[PlannedAdapter],
    cache_bytes: int,
) -> list[float]:
    """One row in FEATURE_NAMES order."""
    rates = np.array([a.rate for a in adapters] or [0.0])
    sizes = np.array([adapter_device_bytes(profile, a) / 1e6 for a in adapters] or [0.0])
    ranks = np.array([float(a.rank) for a in adapters] or [0.0])
    output_mean = workload.output_tokens.mean
    return [
        float(len(adapters)),
        float(rates.sum()),
        float(rates.std()),
        float(sizes.max()),
        float(sizes.mean()),
        float(sizes.std()),
        float(ranks.max()),
        float(ranks.mean()),
        float(ranks.std()),
        cache_bytes / 1e6,
        workload.prompt_tokens.mean,
        output_mean,
        float(rates.sum()) * output_mean,
        float(rates.sum()) / capacity_req_s(profile, engine, workload.prompt_tokens.mean, output_mean),
        cache_bytes / max(sum(adapter_cache_bytes(profile, a) for a in adapters), 1),
    ]
