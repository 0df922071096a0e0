"""The `lorahost` command line. Each command builds Settings once and passes them down.

Heavy imports (torch, FastAPI, SQLAlchemy) happen inside the commands, so `lorahost --help` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="lorahost: serverless multi-tenant LoRA adapter hosting.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.command("demo-model")
def demo_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write base/ and adapters/ into")],
    size: Annotated[str, typer.Option(help="tiny (tests) or small (benchmarks)")] = "tiny",
    num_adapters: Annotated[int, typer.Option(help="How many PEFT adapters to generate")] = 4,
    seed: Annotated[int, typer.Option(help="Random seed")] = 0,
    target_modules: Annotated[
        Optional[str], typer.Option(help="Comma-separated target modules for every adapter (default: varied)")
    ] = None,
) -> None:
    """Generate a seeded Llama-family demo model and PEFT LoRA adapters locally."""
    from gpu_workers.demo_model import SIZES, generate_demo

    if size not in SIZES:
        raise typer.BadParameter(f"unknown size {size!r}; choose one of {', '.join(sorted(SIZES))}")
    if num_adapters < 0:
        raise typer.BadParameter("--num-adapters must be >= 0")
    modules = tuple(m.strip() for m in target_modules.split(",")) if target_modules else None
    generate_demo(out_dir, size=size, num_adapters=num_adapters, seed=seed, target_modules=modules)
    typer.echo(f"wrote {out_dir}/base and {num_adapters} adapters under {out_dir}/adapters")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
