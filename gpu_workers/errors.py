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
    """No room on the device for an adapter right now: every resident adapter is in use."""


class AdapterLoadError(ValueError, EngineError):
    """An adapter directory is invalid for this base model or engine limits."""


class DuplicateRequestError(ValueError, EngineError):
    """A request id is already in the engine."""


class NumericOverflowError(ValueError, EngineError):
    """A request's logits went non-finite (its adapter's weights overflow); only that request is stopped."""
