"""`lorahost tune`: choose this machine's CPU kernels for the worker's model and cache the choices.

    lorahost tune [--base-model DIR] [--retune] [--json]

Runs the kernel tuner the worker runs at start (gpu_workers/engine/kernel_plan.py) with the same settings
(LORAHOST_ENGINE_*, LORAHOST_BASE_MODEL_PATH): each op's candidates timed on the model's shapes, interleaved,
best-of-5, the simplest kept on a near tie; the choices go to the cache a worker on this machine reads
(LORAHOST_ENGINE_KERNEL_CHOICES_PATH), so its start measures nothing. --retune measures again.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer


def tune(
    base_model: Annotated[
        Path | None, typer.Option(help="Base model directory (default LORAHOST_BASE_MODEL_PATH)")
    ] = None,
    retune: Annotated[bool, typer.Option(help="Measure again even where a choice is cached")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table")] = False,
) -> None:
    """Time each kernel candidate on this machine for the worker's model and cache the fastest."""
    from gpu_workers.engine.kernel_plan import tune_for_config
    from gpu_workers.engine.kernel_tuner import KernelTuner
    from gpu_workers.worker.builder import engine_config_from_settings
    from settings import Settings

    settings = Settings() if base_model is None else Settings(base_model_path=base_model)
    if settings.base_model_path is None:
        raise typer.BadParameter("pass --base-model or set LORAHOST_BASE_MODEL_PATH")
    if not (Path(settings.base_model_path) / "config.json").is_file():
        raise typer.BadParameter(
            f"{settings.base_model_path} has no config.json (a Hugging Face model directory)"
        )
    config = engine_config_from_settings(settings)
    tuner = KernelTuner(config.kernel_choices_path, is_reusing_cache=not retune)
    try:
        plan = tune_for_config(config, tuner)
    except ValueError as exc:
        typer.echo(f"lorahost tune: {exc}", err=True)
        raise typer.Exit(2) from exc
    report: dict[str, Any] = {
        "machine": tuner.machine,
        "cache": str(tuner.cache_path),
        "tuner_s": round(tuner.seconds, 4),
        "choices": {
            op: {
                "choice": c.choice,
                "source": c.source,
                "ms": {k: round(v * 1e3, 4) for k, v in c.timings.items()},
                "skipped": c.skipped,
            }
            for op, c in tuner.choices.items()
        },
        "plan": dataclasses.asdict(plan),  # op -> form, as the engine stats' kernel_choices
    }
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernel choices on {tuner.machine['cpu']} ({tuner.machine['threads']} threads)")
    for column in ("op", "choice", "source", "candidates (best ms)"):
        table.add_column(column)
    for op, entry in report["choices"].items():
        timings = ", ".join(f"{name} {ms:.3f}" for name, ms in entry["ms"].items()) or "-"
        table.add_row(op, entry["choice"], entry["source"], timings)
    console = Console()
    console.print(table)
    for op, entry in report["choices"].items():
        for name, why in entry["skipped"].items():
            console.print(f"{op}: {name} is no candidate here: {why}", markup=False)
    console.print(f"measured in {tuner.seconds:.3f} s; cached in {tuner.cache_path}")
