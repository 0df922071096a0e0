"""Profiling a worker's engine for the rank-aware router (`lorahost profile`).

Builds the native engine exactly as a worker does (gpu_workers.worker.builder.engine_config_from_settings), writes
seeded PEFT adapters of the grid's ranks (gpu_workers.engine.demo_model.generate_adapter, every target module),
times their loads, then for every (batch size, prompt length, rank mix) queues one request per batch slot,
times the step that prefills them all and the next decode steps, and fits `scheduler.perf_model` on the
timings; each point is run `num_repeats` times and its best time kept (a shared CPU's scheduling spikes are
10x a tiny model's step, and only ever add time). Rank mixes per batch size: the base model alone, each grid
rank alone, and (batches of 2+) one request of the largest rank with the rest at the smallest, and an
alternation of both: mixed batches are what tells a "sum of ranks" kernel from a "max rank" one.
With `twin=True` the same engine is also measured for the digital twin (gpu_workers/engine/twin_profiler.py:
mixed prefill+decode steps, decode context, distinct adapters, copy rate, scheduler time) and a
`twin.profile.TwinProfile` is fitted beside the router's model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_workers.engine.profile_grid import ProfileGrid, unique_prompt
from scheduler.core.engine_request import EngineRequest
from scheduler.perf_model import LatencySample, PerfModel, fit_latency, fit_load
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
    samples = time_engine(engine, grid, adapter_dirs, echo)
    stats = engine.stats()
    model = fit_profile(samples, _meta(settings, stats, grid))
    twin_profile = None
    if twin:
        from gpu_workers.engine.twin_profiler import measure_twin

        twin_profile = measure_twin(engine, settings, grid, adapter_dirs, echo)
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


def time_engine(engine: Any, grid: ProfileGrid, adapter_dirs: dict[int, Path], echo: Echo) -> ProfileSamples:
    """Load the adapters (timed), warm up, then time every grid point's prefill and decode steps."""
    samples = ProfileSamples(prefill=[], decode=[], load=[])
    for rank, path in adapter_dirs.items():
        samples.load.append((rank, _timed_load(engine, f"rank-{rank}", path, grid.num_repeats)))
    _run_batch(engine, grid, (0,) + tuple(grid.ranks), WARMUP_PROMPT_TOKENS)
    for batch_size in grid.batch_sizes:
        for num_tokens in grid.prompt_tokens:
            for ranks in grid.rank_mixes(batch_size):
                runs = [_run_batch(engine, grid, ranks, num_tokens) for _ in range(grid.num_repeats)]
                samples.prefill.append(
                    LatencySample(tuple((num_tokens, r) for r in ranks), min(p for p, _ in runs))
                )
                decode_ms = min(ms for _, steps in runs for ms in steps)
                samples.decode.append(LatencySample(tuple((1, r) for r in ranks), decode_ms))
    echo(
        f"timed {len(samples.prefill)} grid points x {grid.num_repeats} repeats (best of each), {len(samples.load)} loads"
    )
    return samples


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


def _run_batch(
    engine: Any, grid: ProfileGrid, ranks: tuple[int, ...], num_tokens: int
) -> tuple[float, list[float]]:
    """Queue one request per rank, time the prefill step and the decode steps (ms), then abort them."""
    from scheduler.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=grid.num_decode_steps + 4, temperature=0.0, ignore_eos=True)
    request_ids = [f"profile-{time.perf_counter_ns()}-{i}" for i in range(len(ranks))]
    for i, (request_id, rank) in enumerate(zip(request_ids, ranks)):
        prompt = unique_prompt(num_tokens, i)
        engine.add_request(EngineRequest(request_id, tuple(prompt), params, f"rank-{rank}" if rank else None))
    prefill_ms = _timed_step(engine)
    decode_ms = [_timed_step(engine) for _ in range(grid.num_decode_steps)]
    for request_id in request_ids:
        engine.abort(request_id)
    engine.step()  # collect the aborted outputs
    return prefill_ms, decode_ms


def _timed_step(engine: Any) -> float:
    started = time.perf_counter()
    engine.step()
    return (time.perf_counter() - started) * 1000


def _meta(settings: Settings, stats: dict[str, Any], grid: ProfileGrid) -> dict[str, str]:
    return {
        "base_model": settings.base_model_name,
        "base_model_path": str(settings.base_model_path),
        "device": str(stats.get("device", "")),
        "dtype": str(stats.get("dtype", "")),
        "num_threads": str(settings.engine.num_threads or ""),
        "lora_kernel": str(stats.get("lora_kernel", "")),
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
