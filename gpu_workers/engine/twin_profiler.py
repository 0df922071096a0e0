"""Measuring this engine for the digital twin (`lorahost profile --twin-output PATH`).

On the engine `lorahost profile` built, every step is recorded as the core's own `StepShape` (captured when
`BatchScheduler.schedule()` returns, before the step updates the sequences) with its wall time less the time
`schedule()` took (that is the profile's `scheduler_us`, the median). The grid, per batch size x prompt length:
the profiler's rank mixes (prefill step, then decode steps at growing context), a mixed step (the batch
decoding while one new prompt prefills in the same step), and (batches of 2+) one adapter per request
(copies of the smallest rank under distinct ids), so the fit can tell distinct adapters from rank. Each
distinct shape keeps its best time. The step coefficients come from `twin.fit.fit_step_cost`; the
copy costs from each rank's adapter timed in two parts (preparing its host copy in the engine thread: read,
validate, pack; then the copy to the device: a clone on a CPU engine, PCIe on CUDA); memory from the engine's
KV pool; the model shape from config.json.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_workers.engine.kernel_tuner import machine_fingerprint
from scheduler.core.engine_request import EngineRequest
from settings import Settings
from twin.fit import StepFit, TimedStep, fit_step_cost, nonnegative_lstsq
from twin.profile import ProfileModel, TwinProfile
from twin.step_shape import StepShape

if TYPE_CHECKING:
    from gpu_workers.engine.profile_grid import ProfileGrid

Echo = Callable[[str], None]
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class StepRecorder:
    """Wraps an engine's `scheduler.schedule` to record each plan's StepShape and the time schedule() took."""

    def __init__(self, engine: Any, ranks: dict[str, int]) -> None:
        self.engine, self.ranks = engine, ranks
        self.shape = StepShape()
        self.schedule_seconds = 0.0
        self._schedule = engine.scheduler.schedule
        engine.scheduler.schedule = self._recording_schedule

    def _recording_schedule(self) -> Any:
        started = time.perf_counter()
        plan = self._schedule()
        self.schedule_seconds = time.perf_counter() - started
        self.shape = StepShape.of(plan.entries, self.ranks, plan.host_assisted_adapters)
        return plan

    def timed_step(self) -> tuple[StepShape, float]:
        """Run one engine step: its shape and its seconds less the scheduling time."""
        started = time.perf_counter()
        self.engine.step()
        return self.shape, time.perf_counter() - started - self.schedule_seconds

    def close(self) -> None:
        """Give the engine its own schedule() back."""
        self.engine.scheduler.schedule = self._schedule


def measure_twin(
    engine: Any,
    settings: Settings,
    grid: ProfileGrid,
    adapter_dirs: dict[int, Path],
    echo: Echo,
) -> TwinProfile:
    """Time the twin grid on `engine` (adapters of `adapter_dirs` already loaded as "rank-<r>") and fit the
    twin profile."""
    ranks = {f"rank-{r}": r for r in adapter_dirs}
    ranks.update(_load_copies(engine, grid, adapter_dirs))
    recorder = StepRecorder(engine, ranks)
    best: dict[StepShape, float] = {}
    schedule_us: list[float] = []
    try:
        for _ in range(grid.num_repeats):
            for shape, seconds in _run_grid(engine, recorder, grid, ranks):
                if not shape.is_empty:
                    best[shape] = min(seconds, best.get(shape, float("inf")))
                    schedule_us.append(recorder.schedule_seconds * 1e6)
    finally:
        recorder.close()
    samples = [TimedStep(shape, seconds) for shape, seconds in best.items()]
    fit = fit_step_cost(samples, scheduler_us=statistics.median(schedule_us))
    echo(
        f"twin: {len(samples)} distinct steps timed; {fit.step.lora_form} LoRA form R^2 {fit.r2:.3f} "
        f"(other form {fit.other_r2:.3f})"
    )
    copy_link = _fit_copy(engine, adapter_dirs, grid.num_repeats)
    echo(
        f"adapter copies: prepare {copy_link['prepare_us'] / 1e3:.2f} ms + {copy_link['prepare_gbps']:.2f} GB/s "
        f"in the engine thread, then {copy_link['per_copy_us'] / 1e3:.2f} ms + "
        f"{copy_link['host_to_device_gbps']:.2f} GB/s over the link"
    )
    return _profile(engine, settings, fit, copy_link, len(samples))


def _load_copies(engine: Any, grid: ProfileGrid, adapter_dirs: dict[int, Path]) -> dict[str, int]:
    """Distinct adapter ids, one per slot of the largest batch, twice: copies of the smallest-rank adapter, and
    copies cycling through the grid's ranks (batches of many distinct adapters of mixed ranks are what a
    multi-adapter workload runs; without them the per-adapter terms are fitted on the smallest rank only)."""
    low = min(grid.ranks)
    copies = {}
    for i in range(max(grid.batch_sizes) if max(grid.batch_sizes) > 1 else 0):
        for rank, adapter_id in ((low, f"rank-{low}-copy-{i}"), (_cycled_rank(grid, i), f"mixed-copy-{i}")):
            if adapter_id not in copies:
                engine.load_adapter(adapter_id, adapter_dirs[rank])
                copies[adapter_id] = rank
    return copies


def _cycled_rank(grid: ProfileGrid, i: int) -> int:
    ranks = sorted(grid.ranks)
    return ranks[i % len(ranks)]


def _run_grid(
    engine: Any, recorder: StepRecorder, grid: ProfileGrid, ranks: dict[str, int]
) -> list[tuple[StepShape, float]]:
    """One pass over the twin grid (module doc): the timed steps."""
    low = min(grid.ranks)
    timed: list[tuple[StepShape, float]] = []
    for batch_size in grid.batch_sizes:
        for num_tokens in grid.prompt_tokens:
            batches: list[list[str | None]] = [
                [f"rank-{r}" if r else None for r in mix] for mix in grid.rank_mixes(batch_size)
            ]
            if batch_size > 1:
                batches.append([f"rank-{low}-copy-{i}" for i in range(batch_size)])
                batches.append([f"mixed-copy-{i}" for i in range(batch_size)])
            for adapters in batches:
                timed += _run_batch(engine, recorder, grid, adapters, num_tokens)
    return timed


def _run_batch(
    engine: Any, recorder: StepRecorder, grid: ProfileGrid, adapters: list[str | None], num_tokens: int
) -> list[tuple[StepShape, float]]:
    """Prefill one request per adapter, decode, then add one prompt to the decoding batch (a mixed step) when
    the engine has a slot for it; abort them all."""
    from scheduler.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=grid.num_decode_steps + 4, temperature=0.0, ignore_eos=True)
    request_ids = [_add(engine, params, adapter, num_tokens, i) for i, adapter in enumerate(adapters)]
    timed = [recorder.timed_step() for _ in range(1 + grid.num_decode_steps)]
    if len(adapters) < engine.config.max_num_seqs:
        request_ids.append(_add(engine, params, adapters[0], num_tokens, len(adapters)))
        timed.append(recorder.timed_step())
    for request_id in request_ids:
        engine.abort(request_id)
    engine.step()  # collect the aborted outputs
    return timed


def _add(engine: Any, params: Any, adapter: str | None, num_tokens: int, i: int) -> str:
    from gpu_workers.engine.profile_grid import unique_prompt

    request_id = f"twin-{time.perf_counter_ns()}-{i}"
    engine.add_request(EngineRequest(request_id, tuple(unique_prompt(num_tokens, i)), params, adapter))
    return request_id


def _fit_copy(engine: Any, adapter_dirs: dict[int, Path], num_repeats: int) -> dict[str, float]:
    """The two parts of a cold adapter's copy, each timed per rank (best of `num_repeats`) and fitted as
    fixed + bytes / bandwidth: preparing the host copy (read, validate, pack: in the engine thread, the step
    loop waits) and the copy to the device (on the copier's thread)."""
    transfers = engine.runner.transfers
    prepare: list[tuple[int, float]] = []
    link: list[tuple[int, float]] = []
    for rank, path in adapter_dirs.items():
        best_prepare = best_link = float("inf")
        for i in range(max(1, num_repeats)):
            started = time.perf_counter()
            host_copy = transfers.prepare_host_copy(f"twin-copy-{rank}-{i}", path)
            prepared = time.perf_counter()
            transfers.copier.copy(host_copy)
            best_prepare = min(best_prepare, prepared - started)
            best_link = min(best_link, time.perf_counter() - prepared)
        prepare.append((host_copy.num_bytes, best_prepare))
        link.append((host_copy.num_bytes, best_link))
    prepare_us, prepare_gbps = _fit_bandwidth(prepare)
    per_copy_us, link_gbps = _fit_bandwidth(link)
    return {
        "host_to_device_gbps": link_gbps,
        "per_copy_us": per_copy_us,
        "prepare_gbps": prepare_gbps,
        "prepare_us": prepare_us,
    }


def _fit_bandwidth(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed us, GB/s) of fixed + bytes / bandwidth fitted to (bytes, seconds) samples."""
    x = np.array([[1.0, float(num_bytes)] for num_bytes, _ in samples])
    y = np.array([seconds * 1e6 for _, seconds in samples])
    (fixed_us, us_per_byte), _, _ = nonnegative_lstsq(x, y)
    if us_per_byte <= 0:  # one size, or noise: the average rate, no latency
        fixed_us, us_per_byte = 0.0, float(y.sum() / x[:, 1].sum())
    return float(fixed_us), 1e-3 / max(us_per_byte, 1e-12)


def _profile(
    engine: Any, settings: Settings, fit: StepFit, copy_link: dict[str, float], num_samples: int
) -> TwinProfile:
    """The twin profile of the measured engine (every constant's source names this run)."""
    stats = engine.stats()
    base = Path(str(settings.base_model_path))
    config = json.loads((base / "config.json").read_text())
    dtype = str(stats.get("dtype", "float32"))
    kv_block_bytes = engine.runner.kv_bytes_per_block()
    where = f"lorahost profile on {machine_fingerprint()['cpu']} ({stats.get('device')}, {dtype}, {settings.engine.num_threads or 'default'} threads), {datetime.now(UTC):%Y-%m-%d}"
    fit_source = f"{where}: non-negative least squares over {num_samples} timed steps, R^2 {fit.r2:.3f} ({fit.step.lora_form} form; other form {fit.other_r2:.3f})"
    return TwinProfile.model_validate(
        {
            "hardware": {
                "name": machine_fingerprint()["cpu"],
                "device": str(stats.get("device", "")),
                "engine": "lorahost",
            },
            "model": ProfileModel.from_hf_config(
                config, settings.base_model_name, _DTYPE_BYTES.get(dtype, 4)
            ).model_dump(),
            "step": fit.step.model_dump(),
            "copy": copy_link,
            "memory": {
                "device_bytes": int(stats["num_kv_blocks"]) * kv_block_bytes,
                "block_size": engine.config.block_size,
                "kv_bytes_per_token": kv_block_bytes // engine.config.block_size,
            },
            "sources": {
                "model": f"{base / 'config.json'}",
                "step": fit_source,
                "step.scheduler_us": f"{where}: median time of BatchScheduler.schedule() over the timed steps",
                "copy": f"{where}: per rank, best-of-repeats seconds to prepare an adapter's host copy (read, validate, pack) and to copy it to the device, each fitted as fixed + bytes / bandwidth",
                "memory": f"{where}: the engine's KV pool (num_kv_blocks x KV bytes per block)",
            },
        }
    )
