"""Fitting the digital twin's profile on `lorahost profile`'s measuring pass (`--twin-output PATH`).

The steps are timed once, for both fits, by gpu_workers/engine/grid_timer.py: the router's rank mixes
(prefill step, then decode steps at growing context), a mixed step after each batch's decode steps (the batch
decoding while one new prompt prefills in the same step), and (batches of 2+) one adapter per request
(`load_copies`: copies of the smallest rank, and copies cycling through the ranks, under distinct ids), so
the fit can tell distinct adapters from rank. Each step is the core's own `StepShape` with its wall time less
the time `schedule()` took (that is the profile's `scheduler_us`, the median); each distinct shape keeps its
best time. The step coefficients come from `twin.fit.fit_step_cost`; the CPU-assisted prefill terms from
host-assisted prefill steps made on purpose (gpu_workers/engine/host_prefill_timer.py: cold adapters whose
copy is held) and `twin.fit.fit_host_prefill` (what they took beyond their device part); the
copy costs from each rank's adapter timed in two parts (preparing its host copy in the engine thread: read,
validate, pack; then the copy to the device: a clone on a CPU engine, PCIe on CUDA); memory from the engine's
KV pool; the model shape from config.json.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_workers.engine.engine_stats import runner_part
from gpu_workers.engine.host_prefill_timer import time_host_prefills
from gpu_workers.engine.kernel_tuner import machine_fingerprint
from gpu_workers.engine.prepare_timer import prepare_step_factor, time_prepares
from gpu_workers.engine.thread_limits import limit_this_thread
from settings import Settings
from twin.fit import StepFit, TimedStep, fit_host_prefill, fit_step_cost, nonnegative_lstsq
from twin.profile import ProfileModel, TwinProfile
from twin.step_shape import StepShape

if TYPE_CHECKING:
    from gpu_workers.engine.grid_timer import TimedBatch
    from gpu_workers.engine.grid_timer import TimedStep as GridStep
    from gpu_workers.engine.profile_grid import ProfileGrid

Echo = Callable[[str], None]
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def measure_twin(
    engine: Any,
    settings: Settings,
    grid: ProfileGrid,
    adapter_dirs: dict[int, Path],
    batches: Sequence[TimedBatch],
    echo: Echo,
) -> TwinProfile:
    """Fit the twin profile on the timed `batches` (grid_timer.time_grid with the twin's batches) and time
    the adapter copies of `adapter_dirs` on `engine`."""
    best: dict[StepShape, float] = {}
    schedule_us: list[float] = []
    for batch in batches:
        for step in batch.steps:
            if not step.shape.is_empty:
                seconds = step.seconds - step.schedule_seconds
                best[step.shape] = min(seconds, best.get(step.shape, float("inf")))
                schedule_us.append(step.schedule_seconds * 1e6)
    samples = [TimedStep(shape, seconds) for shape, seconds in best.items()]
    fit = fit_step_cost(samples, scheduler_us=statistics.median(schedule_us))
    echo(
        f"twin: {len(samples)} distinct steps timed; {fit.step.lora_form} LoRA form R^2 {fit.r2:.3f} "
        f"(other form {fit.other_r2:.3f})"
    )
    host_steps = _best_host_steps(time_host_prefills(engine, grid, adapter_dirs))
    fit = dataclasses.replace(fit, step=fit_host_prefill(host_steps, fit.step))
    echo(
        f"twin: {len(host_steps)} host-assisted prefill steps: {fit.step.host_prefill_step_us / 1e3:.2f} ms per "
        f"step + {fit.step.host_prefill_per_token_rank_us:.3f} us per token x rank, beside the device's part"
    )
    copy_link = _fit_copy(engine, adapter_dirs, grid.num_repeats)
    echo(
        f"adapter copies: prepare {copy_link['prepare_us'] / 1e3:.2f} ms + {copy_link['prepare_gbps']:.2f} GB/s "
        f"beside a decoding batch (its steps x{copy_link['prepare_step_factor']:.2f} meanwhile), then "
        f"{copy_link['per_copy_us'] / 1e3:.2f} ms + "
        f"{copy_link['host_to_device_gbps']:.2f} GB/s over the link"
    )
    return _profile(engine, settings, fit, copy_link, len(samples))


def _best_host_steps(steps: Sequence[GridStep]) -> list[TimedStep]:
    """The best time (less scheduling) of each distinct host-assisted step shape."""
    best: dict[StepShape, float] = {}
    for step in steps:
        seconds = step.seconds - step.schedule_seconds
        best[step.shape] = min(seconds, best.get(step.shape, float("inf")))
    return [TimedStep(shape, seconds) for shape, seconds in best.items()]


def load_copies(engine: Any, grid: ProfileGrid, adapter_dirs: dict[int, Path]) -> dict[str, int]:
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


def _fit_copy(engine: Any, adapter_dirs: dict[int, Path], num_repeats: int) -> dict[str, float]:
    """The two parts of a cold adapter's copy, each fitted per rank as fixed + bytes / bandwidth: preparing the
    host copy (read, validate, pack) as the preparer thread does it, beside a decoding batch (median of
    `num_repeats`; gpu_workers/engine/prepare_timer.py, which also gives the steps' slowdown beside it), and
    the copy to the device on a thread limited as the copy thread is (best of `num_repeats`)."""
    transfers = engine.runner.transfers
    prepares = time_prepares(engine, transfers.prepare_host_copy, adapter_dirs, num_repeats)
    by_bytes: dict[int, list[float]] = {}
    for timed in prepares:
        by_bytes.setdefault(timed.num_bytes, []).append(timed.seconds)
    prepare = [(num_bytes, statistics.median(seconds)) for num_bytes, seconds in by_bytes.items()]
    link: list[tuple[int, float]] = []
    for rank, path in adapter_dirs.items():
        host_copy = transfers.prepare_host_copy(f"twin-copy-{rank}", path)
        copy_once = functools.partial(_seconds, functools.partial(transfers.copier.copy, host_copy))
        best_link = min(_on_helper_thread(copy_once) for _ in range(max(1, num_repeats)))
        link.append((host_copy.num_bytes, best_link))
    prepare_us, prepare_gbps = _fit_bandwidth(prepare)
    per_copy_us, link_gbps = _fit_bandwidth(link)
    return {
        "host_to_device_gbps": link_gbps,
        "per_copy_us": per_copy_us,
        "prepare_gbps": prepare_gbps,
        "prepare_us": prepare_us,
        "prepare_step_factor": prepare_step_factor(prepares),
    }


def _seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _on_helper_thread(work: Callable[[], float]) -> float:
    """`work()` on a new thread limited as the engine's helper threads are (thread_limits.py)."""
    result: list[float] = []

    def run() -> None:
        limit_this_thread(1)
        result.append(work())

    thread = threading.Thread(target=run, name="copy-timer", daemon=True)
    thread.start()
    thread.join()
    if not result:
        raise RuntimeError("the timed copy failed on its thread")
    return result[0]


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
    stats = engine.engine_stats()
    runner = runner_part(stats)
    base = Path(str(settings.base_model_path))
    config = json.loads((base / "config.json").read_text())
    dtype = runner.dtype
    kv_block_bytes = engine.runner.kv_bytes_per_block()
    where = f"lorahost profile on {machine_fingerprint()['cpu']} ({runner.device}, {dtype}, {settings.engine.num_threads or 'default'} threads), {datetime.now(UTC):%Y-%m-%d}"
    fit_source = f"{where}: non-negative least squares over {num_samples} timed steps, R^2 {fit.r2:.3f} ({fit.step.lora_form} form; other form {fit.other_r2:.3f})"
    return TwinProfile.model_validate(
        {
            "hardware": {
                "name": machine_fingerprint()["cpu"],
                "device": runner.device,
                "engine": "lorahost",
            },
            "model": ProfileModel.from_hf_config(
                config, settings.base_model_name, _DTYPE_BYTES.get(dtype, 4)
            ).model_dump(),
            "step": fit.step.model_dump(),
            "copy": copy_link,
            "memory": {
                "device_bytes": stats.num_kv_blocks * kv_block_bytes,
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
