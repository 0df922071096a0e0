"""Profiling a worker's engine for the rank-aware router (`lorahost profile`).

Builds the native engine exactly as a worker does (gpu_workers.worker.builder.engine_config_from_settings), writes
seeded PEFT adapters of the grid's ranks (gpu_workers.engine.demo_model.generate_adapter, every target module),
times their loads, then times the grid once (gpu_workers/engine/grid_timer.py: for every batch size, prompt
length and rank mix, one request per batch slot, the step that prefills them all and the next decode steps)
and fits `scheduler.routing.perf_model` on the timings; each point is run `num_repeats` times and its best
time kept (a shared CPU's scheduling spikes are 10x a tiny model's step, and only ever add time). Rank mixes per batch
size: the base model alone, each grid rank alone, and (batches of 2+) one request of the largest rank with the
rest at the smallest, and an alternation of both: mixed batches are what tells a "sum of ranks" kernel from a
"max rank" one. With `twin=True` the same pass also times the digital twin's extra batches (distinct adapters,
mixed prefill+decode steps) and gpu_workers/engine/twin_profiler.py fits a `twin.profile.TwinProfile` from
every step of it (decode context, scheduler time), beside the router's model, which reads the rank-mix
batches only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_workers.engine.engine_stats import RunnerStats
from gpu_workers.engine.grid_timer import TimedBatch, run_untimed, time_grid
from gpu_workers.engine.profile_grid import ProfileGrid
from scheduler.routing.perf_model import LatencySample, PerfModel, fit_latency, fit_load
from settings import Settings
from twin.profile import TwinProfile

Echo = Callable[[str], None]
WARMUP_PROMPT_TOKENS = 16


@dataclass
class ProfileSamples:
    """The raw timings (milliseconds)."""

    prefill: list[LatencySample]
    decode: list[LatencySample]
    load: list[tuple[int, float]]


@dataclass(frozen=True)
class ProfileRun:
    """What a profiling run produced: the router's profile file content (PerfModel.to_dict with meta, plus
    the raw samples) and, when asked for, the twin's profile."""

    content: dict[str, Any]
    twin: TwinProfile | None = None


def run_profile(
    settings: Settings, grid: ProfileGrid, work_dir: Path, echo: Echo = print, *, twin: bool = False
) -> ProfileRun:
    """Profile the configured engine on `grid` (adapters are written under `work_dir`); with `twin`, also
    measure and fit the digital twin's profile on the same engine."""
    from gpu_workers.engine.llm_engine import LLMEngine
    from gpu_workers.worker.builder import engine_config_from_settings

    if settings.base_model_path is None:
        raise ValueError("no base model: set LORAHOST_BASE_MODEL_PATH or pass --base-model")
    config = engine_config_from_settings(settings)
    grid.check(settings.limits.max_rank, config.max_num_seqs, config.max_num_batched_tokens)
    echo(f"writing {len(grid.ranks)} adapters (ranks {list(grid.ranks)}) under {work_dir}")
    adapter_dirs = write_adapters(Path(settings.base_model_path), grid.ranks, work_dir)
    engine = LLMEngine(config)
    samples, batches = time_engine(engine, grid, adapter_dirs, echo, twin=twin)
    model = fit_profile(samples, _meta(settings, engine.runner_stats(), grid))
    twin_profile = None
    if twin:
        from gpu_workers.engine.twin_profiler import measure_twin

        twin_profile = measure_twin(engine, settings, grid, adapter_dirs, batches, echo)
    return ProfileRun({**model.to_dict(), "samples": _samples_json(samples)}, twin_profile)


def fit_profile(samples: ProfileSamples, meta: dict[str, str]) -> PerfModel:
    """The performance model fitted on the samples."""
    return PerfModel(
        prefill=fit_latency(samples.prefill, per_token=True),
        decode=fit_latency(samples.decode, per_token=False),
        load=fit_load(samples.load) if len({r for r, _ in samples.load}) >= 2 else None,
        meta=meta,
    )


def write_adapters(base_dir: Path, ranks: tuple[int, ...], work_dir: Path) -> dict[int, Path]:
    """One seeded PEFT adapter per rank (every target module), reused when already written."""
    from gpu_workers.engine.demo_model import ALL_TARGET_MODULES, generate_adapter

    dirs = {}
    for rank in ranks:
        out = work_dir / f"rank-{rank}"
        if not (out / "adapter_model.safetensors").exists():
            generate_adapter(base_dir, out, rank=rank, target_modules=ALL_TARGET_MODULES, seed=rank)
        dirs[rank] = out
    return dirs


def time_engine(
    engine: Any, grid: ProfileGrid, adapter_dirs: dict[int, Path], echo: Echo, *, twin: bool = False
) -> tuple[ProfileSamples, list[TimedBatch]]:
    """Load the adapters (timed), warm up, then time the grid (with `twin`, also the twin's extra batches, on
    the adapter copies twin_profiler loads): the router's samples and every timed batch."""
    samples = ProfileSamples(prefill=[], decode=[], load=[])
    for rank, path in adapter_dirs.items():
        samples.load.append((rank, _timed_load(engine, f"rank-{rank}", path, grid.num_repeats)))
    run_untimed(engine, grid, [None] + [f"rank-{r}" for r in grid.ranks], WARMUP_PROMPT_TOKENS)
    ranks = {f"rank-{r}": r for r in adapter_dirs}
    if twin:
        from gpu_workers.engine.twin_profiler import load_copies

        ranks.update(load_copies(engine, grid, adapter_dirs))
    batches = time_grid(engine, grid, ranks, twin_batches=twin)
    samples.prefill, samples.decode = router_samples(batches, grid)
    echo(
        f"timed {len(samples.prefill)} grid points x {grid.num_repeats} repeats (best of each), {len(samples.load)} loads"
    )
    return samples, batches


def router_samples(
    batches: list[TimedBatch], grid: ProfileGrid
) -> tuple[list[LatencySample], list[LatencySample]]:
    """The router's prefill and decode samples, one per rank-mix grid point in grid order: the best prefill
    step over the repeats, and the best decode step over the repeats and decode steps (milliseconds, the
    whole engine step)."""
    prefill: dict[tuple[int, tuple[int, ...]], float] = {}
    decode: dict[tuple[int, tuple[int, ...]], float] = {}
    for batch in batches:
        if batch.ranks is None:
            continue
        key = (batch.num_tokens, batch.ranks)
        step_ms = [step.seconds * 1000 for step in batch.steps[: 1 + grid.num_decode_steps]]
        prefill[key] = min(step_ms[0], prefill.get(key, float("inf")))
        decode[key] = min(min(step_ms[1:]), decode.get(key, float("inf")))
    return (
        [
            LatencySample(tuple((num_tokens, r) for r in ranks), ms)
            for (num_tokens, ranks), ms in prefill.items()
        ],
        [LatencySample(tuple((1, r) for r in ranks), ms) for (_, ranks), ms in decode.items()],
    )


def _timed_load(engine: Any, adapter_id: str, path: Path, num_repeats: int) -> float:
    """Milliseconds of a load to the device, best of `num_repeats` (after one untimed load)."""
    engine.load_adapter(adapter_id, path)
    best = float("inf")
    for _ in range(num_repeats):
        engine.unload_adapter(adapter_id)
        started = time.perf_counter()
        engine.load_adapter(adapter_id, path)
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


def _meta(settings: Settings, runner: RunnerStats, grid: ProfileGrid) -> dict[str, str]:
    return {
        "base_model": settings.base_model_name,
        "base_model_path": str(settings.base_model_path),
        "device": runner.device,
        "dtype": runner.dtype,
        "num_threads": str(settings.engine.num_threads or ""),
        "lora_kernel": str(runner.lora_kernel),
        "grid": str(asdict(grid)),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _samples_json(samples: ProfileSamples) -> dict[str, Any]:
    return {
        "prefill": [[list(map(list, s.batch)), round(s.latency_ms, 4)] for s in samples.prefill],
        "decode": [[list(map(list, s.batch)), round(s.latency_ms, 4)] for s in samples.decode],
        "load": [[rank, round(ms, 4)] for rank, ms in samples.load],
    }


def describe(model: PerfModel) -> list[str]:
    """Human-readable lines of a fitted model (what `lorahost profile` prints)."""
    lines = []
    terms = {
        ("prefill", "sum"): "tokens x rank",
        ("prefill", "max"): "tokens x max rank",
        ("decode", "sum"): "rank",
        ("decode", "max"): "batch x max rank",
    }
    for name, fit, unit in (("prefill", model.prefill, "token"), ("decode", model.decode, "sequence")):
        term = terms[name, fit.rank_form]
        other = "max" if fit.rank_form == "sum" else "sum"
        other_r2 = f"{fit.other_r2:.3f}" if fit.other_r2 is not None else "n/a"
        lines.append(
            f"{name}: {fit.intercept_ms:.3f} ms + {fit.per_unit_ms:.4f} ms/{unit} + {fit.per_rank_ms:.6f} ms/({term}) "
            f"[{fit.rank_form} form, R^2 {fit.r2:.3f}; {other} form R^2 {other_r2}; {fit.num_samples} samples]"
        )
    if model.load is not None:
        lines.append(f"adapter load: {model.load.intercept_ms:.3f} ms + {model.load.per_rank_ms:.4f} ms/rank")
    return lines
