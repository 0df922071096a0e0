"""Domain errors raised by registry/ and mapped to HTTP errors by api/errors.py.

Each carries a short machine-readable `code` and a message that says what to change.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class for registry domain errors."""

    code = "registry_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class NotFoundError(RegistryError):
    """The object does not exist, or is not visible to the caller (never reveals other tenants' data)."""

    code = "not_found"


class ConflictError(RegistryError):
    """The request conflicts with the current state (e.g. a concurrent upload of the same name)."""

    code = "conflict"


class InvalidRequestError(RegistryError):
    """The request is malformed in a way the caller can fix (bad adapter name, bad source URI)."""

    code = "invalid_request"


class PermissionDeniedError(RegistryError):
    """The caller may see the object but not change it (e.g. another tenant's public adapter)."""

    code = "permission_denied"


class QuotaExceededError(RegistryError):
    """The tenant's plan has no room for this upload (registry/upload_quota.py)."""

    code = "quota_exceeded"


class AdapterQuotaError(QuotaExceededError):
    """The plan's max_adapters is reached: a new adapter needs one deleted first (HTTP 403)."""

    code = "adapter_quota_exceeded"


class StorageQuotaError(QuotaExceededError):
    """The plan's max_stored_bytes would be passed by this upload (HTTP 413)."""

    code = "storage_quota_exceeded"
