"""Domain errors -> JSON errors `{"error": {"type", "message"[, "param"]}}`, FastAPI's own 404/405/422 included."""

from __future__ import annotations

import logging

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as StorageConnectionError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.errors import (
    AdapterQuotaError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RegistryError,
    StorageQuotaError,
)
from registry.validation import AdapterValidationError

log = logging.getLogger(__name__)

# A database restart or failover (or an S3 hiccup) takes seconds; the pool reconnects on the next call.
RETRY_AFTER_DATABASE_S = 5
# What a database call raises when the database may be unreachable (is_database_unavailable tells which).
DATABASE_ERRORS = (DBAPIError, PoolTimeoutError)

HTTP_ERROR_TYPES = {
    400: "invalid_request",
    401: "authentication_error",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}
REGISTRY_STATUS: dict[type[RegistryError], int] = {
    StorageQuotaError: 413,  # this upload does not fit in what the plan's max_stored_bytes leaves
    AdapterQuotaError: 403,  # the plan allows no more adapters: retrying or shrinking cannot help
    NotFoundError: 404,
    ConflictError: 409,
    InvalidRequestError: 400,
    PermissionDeniedError: 403,
}
# Validator codes about the shape of the request (which files were sent) rather than their content.
REQUEST_SHAPE_CODES = frozenset(
    {
        "pickle_not_allowed",
        "duplicate_file",
        "unexpected_file",
        "missing_config",
        "missing_weights",
        "corrupt_archive",
        "invalid_archive_layout",
        "unsupported_archive",
        "unsupported_archive_member",
        "unknown_base_model",
        "base_model_required",
        "base_model_mismatch",
    }
)


class ApiError(Exception):
    """An HTTP error with a machine-readable type and a message saying what to change."""

    def __init__(
        self,
        status_code: int,
        type_: str,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.type = type_
        self.message = message
        self.headers = headers
        self.param = param  # the request field at fault (OpenAI's `param`), when one is


def error_response(
    status_code: int,
    type_: str,
    message: str,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    """The one JSON error shape (`param`, naming the field at fault, only when there is one)."""
    error: dict[str, str] = {"type": type_, "message": message}
    if param is not None:
        error["param"] = param
    return JSONResponse({"error": error}, status_code=status_code, headers=headers)


def validation_error_status(code: str) -> int:
    """413 for size limits, 400 for the wrong set of files, 422 for invalid adapter content."""
    if code.startswith("too_many") or (code.endswith("too_large") and code != "rank_too_large"):
        return 413
    if code in REQUEST_SHAPE_CODES or code.startswith(("archive", "unsafe")):
        return 400
    return 422


def registry_status(exc: RegistryError) -> int:
    """The HTTP status of a registry error (its class or nearest base in REGISTRY_STATUS; else 400)."""
    for cls in type(exc).__mro__:
        if cls in REGISTRY_STATUS:
            return REGISTRY_STATUS[cls]
    return 400


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.type, exc.message, exc.headers, exc.param)


async def _registry_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RegistryError)
    return error_response(registry_status(exc), exc.code, exc.message)


async def _adapter_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AdapterValidationError)
    return error_response(validation_error_status(exc.code), exc.code, exc.message)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return error_response(exc.status_code, type_, message, getattr(exc, "headers", None))


async def _request_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg')}")
    return error_response(422, "invalid_request", "; ".join(parts) or "invalid request")


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database cannot be reached or is not answering (down, restarting, failing over,
    its connection dropped, the pool exhausted) rather than that a statement is wrong."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    if not is_database_unavailable(exc):
        return await _unhandled_error(_, exc)
    log.warning(
        "the database is unavailable: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    )
    return error_response(
        503,
        "database_unavailable",
        "the registry database is unavailable for a moment (a restart or failover) and this request could not be "
        f"carried out; retry after {RETRY_AFTER_DATABASE_S} s",
        {"Retry-After": str(RETRY_AFTER_DATABASE_S)},
    )


def is_storage_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the S3 blob store cannot be reached or is failing for a moment (connection refused or
    dropped, a timeout, a 5xx such as 503 SlowDown) rather than refusing this request."""
    if isinstance(exc, StorageConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return isinstance(status, int) and status >= 500
    return False


async def _storage_error(request: Request, exc: Exception) -> JSONResponse:
    if not is_storage_unavailable(exc):
        return await _unhandled_error(request, exc)
    log.warning("the blob store is unavailable: %s", type(exc).__name__)
    return error_response(
        503,
        "storage_unavailable",
        "the adapter store (S3) is unavailable for a moment and this request could not be carried out; nothing "
        f"was kept; retry after {RETRY_AFTER_DATABASE_S} s",
        {"Retry-After": str(RETRY_AFTER_DATABASE_S)},
    )


async def _unhandled_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "internal server error; retry, or contact the operator")


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler on the app."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RegistryError, _registry_error)
    app.add_exception_handler(AdapterValidationError, _adapter_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(PoolTimeoutError, _database_error)
    app.add_exception_handler(BotoCoreError, _storage_error)
    app.add_exception_handler(ClientError, _storage_error)
    app.add_exception_handler(Exception, _unhandled_error)
