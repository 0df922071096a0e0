"""`lorahost profile`: fit this worker's performance model and write the profile file the worker publishes.

    lorahost profile --output profile.json [--base-model DIR] [--ranks 8,32,64] [--batch-sizes 1,2,4,8]
                     [--prompt-tokens 16,64] [--decode-steps 3] [--repeats 3] [--work-dir DIR]
                     [--twin-output twin.json]

The engine is built from the same settings as `lorahost worker` (LORAHOST_ENGINE_*, LORAHOST_BASE_MODEL_PATH);
point the worker at the file with LORAHOST_WORKER_PROFILE_PATH. Runs on the hardware it profiles.
`--twin-output` also measures what the digital twin's cost model needs (mixed prefill+decode steps, decode
context, distinct adapters, CPU-assisted prefill steps of cold adapters, copy rate, scheduler time) and writes a twin profile (twin/profile.py;
`.yaml` or `.json`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer


def _ints(value: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{name} must be comma-separated integers, got {value!r}") from None
    if not values:
        raise typer.BadParameter(f"{name} needs at least one value")
    return values


def profile(
    output: Annotated[Path, typer.Option(help="Where to write the profile (JSON)")],
    base_model: Annotated[
        Path | None, typer.Option(help="Base model directory (default LORAHOST_BASE_MODEL_PATH)")
    ] = None,
    ranks: Annotated[str, typer.Option(help="LoRA ranks to time, comma-separated")] = "8,32,64",
    batch_sizes: Annotated[str, typer.Option(help="Requests per batch, comma-separated")] = "1,2,4,8",
    prompt_tokens: Annotated[
        str, typer.Option(help="Prompt lengths of the prefills, comma-separated")
    ] = "16,64",
    decode_steps: Annotated[int, typer.Option(help="Decode steps timed after each prefill")] = 3,
    repeats: Annotated[int, typer.Option(help="Runs per grid point (the best time is kept)")] = 3,
    work_dir: Annotated[
        Path | None,
        typer.Option(help="Where the seeded adapters are written (default: a temporary directory)"),
    ] = None,
    twin_output: Annotated[
        Path | None,
        typer.Option(help="Also measure and write the digital twin's profile here (.json or .yaml)"),
    ] = None,
) -> None:
    """Time the engine's prefill and decode steps on a grid of batch sizes x LoRA ranks, fit the latency model
    (sum-of-ranks or max-rank term, whichever fits better) and write the profile file."""
    from gpu_workers.engine.profiler import ProfileGrid, describe, run_profile
    from scheduler.routing.perf_model import PerfModel
    from settings import Settings
    from twin.profile import save_profile

    grid = ProfileGrid(
        ranks=_ints(ranks, "--ranks"),
        batch_sizes=_ints(batch_sizes, "--batch-sizes"),
        prompt_tokens=_ints(prompt_tokens, "--prompt-tokens"),
        num_decode_steps=decode_steps,
        num_repeats=repeats,
    )
    settings = Settings() if base_model is None else Settings(base_model_path=base_model)
    if settings.base_model_path is None:
        raise typer.BadParameter("pass --base-model or set LORAHOST_BASE_MODEL_PATH")
    with tempfile.TemporaryDirectory(prefix="lorahost-profile-") as tmp:
        try:
            run = run_profile(
                settings, grid, work_dir or Path(tmp), echo=typer.echo, twin=twin_output is not None
            )
        except ValueError as exc:
            typer.echo(f"lorahost profile: {exc}", err=True)
            raise typer.Exit(2) from exc
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(run.content, indent=1, sort_keys=True))
    for line in describe(PerfModel.from_dict(run.content)):
        typer.echo(line)
    typer.echo(f"wrote {output}; serve with LORAHOST_WORKER_PROFILE_PATH={output}")
    if twin_output is not None and run.twin is not None:
        save_profile(run.twin, twin_output)
        typer.echo(f"wrote the twin profile {twin_output}")
