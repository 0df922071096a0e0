"""A worker's base model from the blob store, by name (issue 24): the catalog's manifest
(registry/base_model_manifest.py) lists the files with their sha256; they are fetched into a local cache keyed by
those digests and verified, so the chart and compose need no model volume.

The cache directory is `<root>/<digest of the manifest's file digests>/`: the same files are fetched once per
machine, and a changed model is a new directory. Each file is downloaded to `<file>.part`, checked against its
sha256 and only then renamed into place; a restart skips the files already in place (their size is checked,
their digest was checked before the rename), so an interrupted download resumes file by file. Before
downloading, the free disk space is compared with what is still missing: too little is a clear error naming
both, not a full disk halfway. The fetch and the free-space reading are injected (the worker passes the blob
store's download), so tests drive this module without a store.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

from registry.base_model_manifest import ModelFile, parse_manifest
from registry.digests import sha256_file

FetchFn = Callable[[str, Path], None]  # (blob key, destination file) -> None
COMPLETE_MARKER = ".complete"


class BaseModelFetchError(RuntimeError):
    """The base model could not be fetched (missing manifest, a corrupt blob, too little disk)."""


def model_cache_dir(root: Path, files: list[ModelFile]) -> Path:
    """Where a model with these files lives under `root` (keyed by the files' names and digests)."""
    digest = hashlib.sha256(
        "\n".join(f"{f.path}:{f.sha256}" for f in sorted(files, key=lambda f: f.path)).encode()
    )
    return Path(root) / digest.hexdigest()[:32]


def fetch_base_model(
    name: str,
    read_manifest: Callable[[], bytes | None],
    fetch: FetchFn,
    root: Path,
    free_bytes: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free,
) -> Path:
    """The local directory of base model `name`, fetched and verified if needed (BaseModelFetchError saying
    what to do otherwise)."""
    raw = read_manifest()
    if raw is None:
        raise BaseModelFetchError(
            f"base model {name!r} is not in the blob store's catalog: add it with `lorahost models add {name} "
            "--from DIR|GGUF|smollm2`, or give the worker a local model (--base-model / LORAHOST_BASE_MODEL_PATH)"
        )
    try:
        manifest_name, files = parse_manifest(raw)
    except ValueError as exc:
        raise BaseModelFetchError(f"base model {name!r}: {exc}") from exc
    if manifest_name != name:
        raise BaseModelFetchError(f"the manifest of base model {name!r} names {manifest_name!r}")
    target = model_cache_dir(root, files)
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    missing = [f for f in files if not _is_in_place(target / f.path, f)]
    num_missing_bytes = sum(f.num_bytes for f in missing)
    available = free_bytes(target)
    if num_missing_bytes > available:
        raise BaseModelFetchError(
            f"base model {name!r} needs {num_missing_bytes / 1e9:.2f} GB more at {target}, and only "
            f"{available / 1e9:.2f} GB are free: free disk space or point LORAHOST_DATA_DIR at a larger disk"
        )
    for model_file in missing:
        _fetch_one(model_file, target, fetch, name)
    (target / COMPLETE_MARKER).write_text(name)
    return target


def _is_in_place(path: Path, model_file: ModelFile) -> bool:
    return path.is_file() and path.stat().st_size == model_file.num_bytes


def _fetch_one(model_file: ModelFile, target: Path, fetch: FetchFn, name: str) -> None:
    part = target / f"{model_file.path}.part"
    part.unlink(missing_ok=True)
    try:
        fetch(model_file.blob_key, part)
    except Exception as exc:  # the store's own error (missing blob, network): this file cannot be had now
        part.unlink(missing_ok=True)
        raise BaseModelFetchError(
            f"base model {name!r}: could not fetch {model_file.blob_key} ({exc}); if it is missing, add the model "
            "again"
        ) from exc
    digest = sha256_file(part)
    if digest != model_file.sha256:
        part.unlink(missing_ok=True)
        raise BaseModelFetchError(
            f"base model {name!r}: {model_file.path} from {model_file.blob_key} has sha256 {digest}, expected "
            f"{model_file.sha256} (a corrupt or replaced blob: add the model again)"
        )
    part.rename(target / model_file.path)
