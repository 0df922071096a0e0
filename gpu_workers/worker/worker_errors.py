"""The errors a worker call reports: {"error": {"type": code, "message"}} with the code's HTTP status before a
stream starts (cluster/protocol.py `WORKER_ERROR_STATUS`), or a terminal `error` event after."""

from __future__ import annotations

from cluster.protocol import WORKER_ERROR_STATUS


class WorkerError(Exception):
    """An error a worker call reports as {"error": {"type": code, "message"}} or an `error` event."""

    code = "internal"
    status_code = WORKER_ERROR_STATUS[code]


class BadRequestError(WorkerError):
    """The request cannot run as sent (sampling, prompt, duplicate id)."""

    code = "bad_request"
    status_code = WORKER_ERROR_STATUS[code]


class AdapterUnavailableError(WorkerError):
    """The adapter's files could not be fetched, verified or loaded."""

    code = "adapter_unavailable"
    status_code = WORKER_ERROR_STATUS[code]


class OverloadedError(WorkerError):
    """The worker cannot take requests right now (its model is still loading); retry or route elsewhere."""

    code = "overloaded"
    status_code = WORKER_ERROR_STATUS[code]


class DrainingError(WorkerError):
    """The worker is shutting down and accepts no new requests; route elsewhere."""

    code = "draining"
    status_code = WORKER_ERROR_STATUS[code]
