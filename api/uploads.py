"""Receive a multipart adapter upload into a temp directory, bounded by max_upload_bytes.

The request body is streamed; the byte count is enforced while reading (413 as soon as it is exceeded),
and file names are checked before any adapter file is written. A client that disconnects mid-body drops
its upload: nothing is stored, and one info line is logged (no traceback).

Scratch space: each upload gets a folder under `upload_scratch_dir(settings)`, one parent per API instance
(settings.api.api_instance_id), removed when the request ends. A process killed mid-upload leaves its folder
behind; `remove_abandoned_upload_dirs` empties the instance's parent when the instance starts again (nothing
of the new process is in it yet). The multipart parser's own spool files are anonymous (unlinked on
creation), so a kill leaves nothing of them.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from api.errors import ApiError
from api.request_text import check_form_text
from registry.adapter_pipeline import check_incoming_names, safe_basename
from settings import Settings

log = logging.getLogger(__name__)

MAX_FILES = 8
MAX_FIELDS = 8
COPY_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ReceivedUpload:
    """The form fields and the names of the files written into the upload directory."""

    name: str
    visibility: str | None
    filenames: list[str]
    base_model: str | None = None  # the base model the adapter is for (name or alias); None: from its config


def upload_scratch_dir(settings: Settings) -> Path:
    """This API instance's parent folder of upload scratch folders (created if missing)."""
    instance = re.sub(r"[^A-Za-z0-9._-]", "_", settings.api.resolved_api_instance_id())
    path = settings.resolved_upload_tmp_dir() / instance
    path.mkdir(parents=True, exist_ok=True)
    return path


def remove_abandoned_upload_dirs(settings: Settings) -> list[Path]:
    """At start, before serving: remove the scratch folders this instance's previous run left (kill -9)."""
    parent = upload_scratch_dir(settings)
    abandoned = sorted(parent.iterdir())
    for path in abandoned:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return abandoned


class UploadTooLargeError(MultiPartException):
    """The body exceeded max_upload_bytes (a MultiPartException so the parser closes its spooled files)."""


class UploadAbandonedError(MultiPartException):
    """The client disconnected before the body ended (a MultiPartException, as above)."""

    def __init__(self, num_bytes: int) -> None:
        super().__init__(f"client disconnected after {num_bytes} bytes")
        self.num_bytes = num_bytes


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        "upload_too_large",
        f"upload exceeds the limit of {max_bytes} bytes; send a smaller adapter (lower rank, fewer target "
        "modules or fp16/bf16 weights) or ask the operator to raise LORAHOST_MAX_UPLOAD_BYTES",
    )


def client_disconnected(what: str, num_bytes: int | None = None) -> ApiError:
    """Log (one info line, no traceback) that the client left mid-body; the error to raise (its response
    goes nowhere, the client is gone)."""
    received = "" if num_bytes is None else f" after {num_bytes} bytes"
    log.info("%s dropped: the client disconnected%s", what, received)
    return ApiError(
        400, "client_disconnected", "the client disconnected before the body ended; send it again"
    )


async def _bounded(request: Request, max_bytes: int) -> AsyncGenerator[bytes, None]:
    num_bytes = 0
    try:
        async for chunk in request.stream():
            num_bytes += len(chunk)
            if num_bytes > max_bytes:
                raise UploadTooLargeError(f"body larger than {max_bytes} bytes")
            yield chunk
    except ClientDisconnect:
        raise UploadAbandonedError(num_bytes) from None


async def receive_upload(request: Request, upload_dir: Path, max_bytes: int) -> ReceivedUpload:
    """Parse the multipart body (`name`, optional `visibility` and `base_model`, one or more `files`) into
    `upload_dir`."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    parser = MultiPartParser(
        request.headers, _bounded(request, max_bytes), max_files=MAX_FILES, max_fields=MAX_FIELDS
    )
    try:
        form = await parser.parse()
    except UploadTooLargeError:
        raise _too_large(max_bytes) from None
    except UploadAbandonedError as exc:
        raise client_disconnected("upload", exc.num_bytes) from None
    except MultiPartException as exc:
        raise ApiError(
            400, "invalid_multipart", f"could not read the multipart body: {exc.message}"
        ) from None
    try:
        return await _save_form(form, upload_dir)
    finally:
        await form.close()


async def _save_form(form: FormData, upload_dir: Path) -> ReceivedUpload:
    check_form_text(form)
    name = form.get("name")
    visibility = form.get("visibility")
    base_model = form.get("base_model")
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_request", "form field 'name' is required (the adapter name)")
    if visibility is not None and not isinstance(visibility, str):
        raise ApiError(400, "invalid_request", "form field 'visibility' must be 'private' or 'public'")
    if base_model is not None and (not isinstance(base_model, str) or not base_model.strip()):
        raise ApiError(
            400, "invalid_request", "form field 'base_model' must name a base model (GET /v1/models)"
        )
    if not files:
        raise ApiError(
            400,
            "missing_files",
            "no files: send the adapter as -F files=@adapter_config.json -F files=@adapter_model.safetensors, "
            "or one archive as -F files=@adapter.zip",
        )
    filenames = [safe_basename(f.filename or "") for f in files]
    check_incoming_names(filenames)
    await run_in_threadpool(_write_files, files, filenames, upload_dir)
    return ReceivedUpload(
        name=name, visibility=visibility or None, filenames=filenames, base_model=base_model or None
    )


def _write_files(files: list[UploadFile], filenames: list[str], upload_dir: Path) -> None:
    for upload, filename in zip(files, filenames, strict=True):
        upload.file.seek(0)
        with open(upload_dir / filename, "wb") as out:
            shutil.copyfileobj(upload.file, out, COPY_CHUNK_BYTES)
