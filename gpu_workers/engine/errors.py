"""Errors the engine raises to its callers (each says what to change)."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for engine errors."""


class PromptTooLongError(ValueError, EngineError):
    """The prompt (or prompt + requested tokens budget) cannot fit max_model_len or the KV cache."""


class AdapterNotLoadedError(KeyError, EngineError):
    """A request names an adapter that is not loaded in this engine."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "adapter not loaded"


class AdapterInUseError(RuntimeError, EngineError):
    """An adapter cannot be unloaded while running or waiting requests use it."""


class AdapterCapacityError(RuntimeError, EngineError):
    """An explicit load (load_adapter / install_adapter) finds no room in the page pool right now: the
    adapters that would have to go are in use. Requests never see it: they wait in the engine's queue."""


class AdapterLoadError(ValueError, EngineError):
    """An adapter directory is invalid for this base model or engine limits."""


class DuplicateRequestError(ValueError, EngineError):
    """A request id is already in the engine."""


class RequestFailedError(EngineError):
    """The engine stopped one request (finish_reason "error"); `code` says why (RequestOutput.error_code)."""

    code = "internal"


class NumericOverflowError(ValueError, RequestFailedError):
    """A request's logits went non-finite (its adapter's weights overflow); only that request is stopped."""

    code = "numeric_overflow"


class AdapterLoadFailedError(RuntimeError, RequestFailedError):
    """A planned copy of a registered adapter to the device failed (its host files vanished or became
    invalid after registration); the requests using it are stopped, the others keep running."""

    code = "adapter_unavailable"


REQUEST_ERRORS: dict[str, type[RequestFailedError]] = {
    cls.code: cls for cls in (NumericOverflowError, AdapterLoadFailedError)
}


def request_error(code: str | None, message: str) -> RequestFailedError:
    """The exception a stream raises for a request the engine stopped with `code` (unknown: internal)."""
    cls = REQUEST_ERRORS.get(code or "")
    if cls is None:
        return RequestFailedError(message)
    return cls(message)
