"""Talking to workers: pick one (scheduler.routing.router) and stream a generation from it.

The contract is `cluster.protocol`: POST {url}/internal/v1/generate with the bearer internal token
returns zero or more `delta` events then exactly one `final` or `error` event. Closing the HTTP stream
aborts the engine request, so `WorkerStream.aclose()` is how a client disconnect reaches the engine.

Transports: workers are reached over HTTP (NDJSON), except a worker running in this process (embedded
mode, `lorahost serve`): whoever runs it publishes a `LocalWorkerTransport` (services.worker_transport)
and requests to that worker skip the loopback HTTP hop. Both transports give the same
`WorkerStream`: same first-event semantics, same refusal mapping, aclose() aborts the engine request.
The HTTP side reads the body as NDJSON (api/worker_ndjson.py) over api/http1_transport.py (asyncio protocols
and httptools: O(1) pool bookkeeping per request, each request in one write, backpressure per connection).

A worker that cannot start the request (connection refused/reset, a non-200 answer, or an `overloaded` /
`draining` error before any token) is retried on another worker once; then the request gets a 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from pydantic import ValidationError

from api.http1_transport import Http1Transport
from api.routed_since_view import RoutedRequest, RoutedSinceView
from api.worker_ndjson import HttpEventSource, error_fields
from cluster.membership import WorkerRecord
from cluster.protocol import INTERNAL_PREFIX, GenerateEvent, GenerateRequest, WorkerRefusedError
from cluster.worker_view import worker_view
from scheduler.routing.router import Router, RouteRequest, ready_workers
from scheduler.routing.router_policies import make_router

log = logging.getLogger(__name__)

RETRYABLE_ERROR_CODES = frozenset({"overloaded", "draining"})
MAX_ATTEMPTS = 2  # the first worker, then one other
# The internal token, or a callable reading it when a request is sent (it may be published after startup).
TokenSource = str | None | Callable[[], str | None]
MAX_CACHED_URLS = 1024  # parsed worker URLs kept (cleared when full: workers come and go)
DEFAULT_READ_TIMEOUT_S = (
    30.0  # settings.api.worker_read_timeout_s' default: workers send keepalives meanwhile
)
DEFAULT_MAX_CONNECTIONS = 8192  # settings.api.max_worker_connections' default
MAX_IDLE_CONNECTIONS = 256  # kept open for reuse once their stream ended (then closed after KEEPALIVE_S idle)
KEEPALIVE_S = 5.0
WARN_EVERY_S = 10.0  # a worker that cannot start requests is logged at warning level at most this often


def worker_limits(max_connections: int) -> httpx.Limits:
    """The connection pool's limits: max_connections open (streaming or idle), a bounded number idle."""
    return httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=min(max_connections, MAX_IDLE_CONNECTIONS),
        keepalive_expiry=KEEPALIVE_S,
    )


class WorkerUnavailableError(Exception):
    """No worker could start the request (none live, or every attempt failed before the first event)."""


class EventSource(Protocol):
    """The events of one open generate stream after the first (one transport's side of a WorkerStream)."""

    async def next_event(self) -> GenerateEvent | None:
        """The next event; None at the end of the stream; raises if the stream broke."""
        ...

    async def aclose(self, has_ended: bool) -> None:
        """Release the stream; before the terminal event (`has_ended` False) this aborts the request."""
        ...


class LocalWorkerTransport(Protocol):
    """A worker in this process, reached without HTTP (embedded mode; gpu_workers.worker.inproc_transport implements it).

    `open_stream` runs the worker's checks and returns the stream, or raises
    `cluster.protocol.WorkerRefusedError` (what HTTP answers with a non-200 status).
    """

    def serves(self, worker: WorkerRecord) -> bool:
        """True if `worker` is this in-process worker."""
        ...

    async def open_stream(self, request: GenerateRequest) -> EventSource:
        """Start the generation (no event read yet)."""
        ...


def num_ready_workers(base_model: str, records: Iterable[WorkerRecord]) -> int:
    """How many live records can take a request for `base_model` now (0 = cold start)."""
    return len(ready_workers(base_model, [worker_view(r) for r in records]))


def choose_worker(
    router: Router,
    request: RouteRequest,
    records: Iterable[WorkerRecord],
    exclude: frozenset[str] = frozenset(),
    routed_since: RoutedSinceView | None = None,
) -> WorkerRecord | None:
    """The router's choice among live records not in `exclude`, or None. With `routed_since`, each worker's
    view counts the requests routed there since its record was published (api/routed_since_view.py)."""
    by_id = {r.worker_id: r for r in records}
    views = routed_since.views(by_id.values()) if routed_since else [worker_view(r) for r in by_id.values()]
    chosen = router.choose(request, [v for v in views if v.worker_id not in exclude])
    return by_id.get(chosen) if chosen is not None else None


@dataclass
class WorkerStream:
    """An open generate stream whose first event has been read (so failures to start are known)."""

    worker_id: str
    first: GenerateEvent
    source: EventSource
    is_closed: bool = field(default=False)
    has_ended: bool = field(default=False)  # the worker sent its terminal event: the body is (nearly) over
    on_close: Callable[[], None] | None = field(default=None)  # called once, when the stream is closed

    def __post_init__(self) -> None:
        self.has_ended = self.first.type != "delta"

    async def events(self) -> AsyncIterator[GenerateEvent]:
        """The first event, then the rest; a broken or truncated stream ends with a synthetic error event."""
        yield self.first
        if self.first.type != "delta":
            return
        while True:
            try:
                event = await self.source.next_event()
            except (httpx.HTTPError, ValidationError, ValueError) as exc:
                yield GenerateEvent(type="error", code="internal", message=f"worker stream broke: {exc!r}")
                return
            if event is None:
                yield GenerateEvent(
                    type="error", code="internal", message="worker stream ended without a final event"
                )
                return
            if event.type != "delta":
                self.has_ended = True
            yield event
            if event.type != "delta":
                return

    async def aclose(self) -> None:
        """Close the stream (aborts the engine request if it is still running). Idempotent."""
        if self.is_closed:
            return
        self.is_closed = True
        try:
            await self.source.aclose(self.has_ended)
        finally:
            if self.on_close is not None:
                self.on_close()


class _NoEvents:
    """The source of a stream that ended with its first event (a refusal)."""

    async def next_event(self) -> GenerateEvent | None:
        return None

    async def aclose(self, has_ended: bool) -> None:
        return None


def worker_timeout(read_timeout_s: float) -> httpx.Timeout:
    """A worker request's timeouts: 5 s to connect, 30 s to write, 10 s to get a connection from the pool,
    read_timeout_s between two reads of its stream."""
    return httpx.Timeout(connect=5.0, read=read_timeout_s, write=30.0, pool=10.0)


class WorkerClient:
    """One per API process: a pooled HTTP transport plus the internal token and the routing policy
    (settings.routing.policy via services.router; the default policy when none is given). `routed_since`
    counts the requests it routed to each worker since that worker's view was published, so the router does
    not send every request of a view's lifetime to the same worker (api/routed_since_view.py).

    Requests go to the transport itself, not through an httpx.AsyncClient: the client's layers (auth, redirects,
    its cookie jar) do nothing a worker needs, and its jar would keep a cookie one worker response set and send it
    with every later request, whoever's; and they cost ~0.1 ms of the event loop's CPU per request, most of it
    parsing each response for cookies (benchmarks/worker_client_writes.py: 250 -> 150-175 us per request, open to
    end; benchmarks/RESULTS.md, "Chaos & scale, fifteenth pass")."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        internal_token: TokenSource,
        router: Router | None = None,
        local: LocalWorkerTransport | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> None:
        self.transport = transport
        # a request's "timeout" extension, which the transport reads
        self._timeouts = (timeout or worker_timeout(DEFAULT_READ_TIMEOUT_S)).as_dict()
        self.internal_token = internal_token
        self.router = router or make_router()
        self.local = local  # the in-process worker (embedded mode), reached without HTTP
        self.routed_since = RoutedSinceView()
        self._generate_urls: dict[str, httpx.URL] = {}
        self._warned_at: dict[str, float] = {}  # worker id -> when its last unavailability warning was logged

    @classmethod
    def create(
        cls,
        internal_token: TokenSource,
        transport: httpx.AsyncBaseTransport | None = None,
        local: LocalWorkerTransport | None = None,
        router: Router | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> WorkerClient:
        """A client with the default timeouts and at most `max_connections` open to workers together (each
        stream holds one; settings.api.max_worker_connections), giving up a stream silent for read_timeout_s
        (settings.api.worker_read_timeout_s); pass a transport to reach fake workers in tests,
        `local` for an in-process worker, `router` for the routing policy."""
        transport = transport or Http1Transport(worker_limits(max_connections))
        return cls(
            transport, internal_token, router=router, local=local, timeout=worker_timeout(read_timeout_s)
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.transport.aclose()

    def _generate_url(self, worker_url: str) -> httpx.URL:
        """The worker's parsed generate URL (parsed once per worker: parsing costs more than the lookup)."""
        url = self._generate_urls.get(worker_url)
        if url is None:
            if len(self._generate_urls) >= MAX_CACHED_URLS:
                self._generate_urls.clear()
            url = self._generate_urls[worker_url] = httpx.URL(
                f"{worker_url.rstrip('/')}{INTERNAL_PREFIX}/generate"
            )
        return url

    def _headers(self) -> dict[str, str]:
        token = self.internal_token() if callable(self.internal_token) else self.internal_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def open(self, worker: WorkerRecord, request: GenerateRequest) -> WorkerStream:
        """Start a generation on one worker and read its first event; WorkerUnavailableError if it cannot."""
        if self.local is not None and self.local.serves(worker):
            return await self._open_local(self.local, worker, request)
        http_request = httpx.Request(
            "POST",
            self._generate_url(worker.url),
            content=request.model_dump_json(),
            headers={**self._headers(), "Content-Type": "application/json"},
            extensions={"timeout": self._timeouts},
        )
        try:
            response = await self.transport.handle_async_request(http_request)
            response.request = http_request
        except httpx.HTTPError as exc:
            raise WorkerUnavailableError(
                f"worker {worker.worker_id} unreachable: {type(exc).__name__}"
            ) from exc
        try:
            return await self._first_event(worker, response)
        except BaseException:
            await response.aclose()
            raise

    async def _open_local(
        self, local: LocalWorkerTransport, worker: WorkerRecord, request: GenerateRequest
    ) -> WorkerStream:
        """The in-process path: the same checks and mapping as HTTP, without the loopback hop.

        A refusal (WorkerRefusedError, from open_stream or in place of the first event) maps as a non-200
        HTTP answer does: 5xx is retryable (WorkerUnavailableError), 4xx is a terminal error event.
        """
        source: EventSource | None = None
        try:
            source = await local.open_stream(request)
            first = await source.next_event()
            stream = self._started(worker, source, first)
        except WorkerRefusedError as exc:
            if source is not None:
                await source.aclose(True)
            if exc.status_code >= 500:
                raise WorkerUnavailableError(
                    f"worker {worker.worker_id} answered {exc.status_code}: {exc.code}: {exc.message}"
                ) from exc
            event = GenerateEvent(type="error", code=exc.code, message=exc.message)
            return WorkerStream(worker.worker_id, event, _NoEvents(), is_closed=True)
        except BaseException:
            if source is not None:
                await source.aclose(False)
            raise
        return stream

    async def _first_event(self, worker: WorkerRecord, response: httpx.Response) -> WorkerStream:
        if response.status_code != 200:
            return await self._refusal(worker, response)
        source = HttpEventSource.of(response)
        try:
            first = await source.next_event()
        except (httpx.HTTPError, ValidationError, ValueError) as exc:
            raise WorkerUnavailableError(
                f"worker {worker.worker_id} broke before the first event: {exc!r}"
            ) from exc
        return self._started(worker, source, first)

    @staticmethod
    def _started(worker: WorkerRecord, source: EventSource, first: GenerateEvent | None) -> WorkerStream:
        """The stream, given its first event; WorkerUnavailableError if it is none or a retryable refusal."""
        if first is None:
            raise WorkerUnavailableError(f"worker {worker.worker_id} closed the stream without an event")
        if first.type == "error" and first.code in RETRYABLE_ERROR_CODES:
            raise WorkerUnavailableError(f"worker {worker.worker_id} is {first.code}: {first.message}")
        return WorkerStream(worker.worker_id, first, source)

    async def _refusal(self, worker: WorkerRecord, response: httpx.Response) -> WorkerStream:
        """A non-200 answer: 5xx (draining, overloaded, broken) is retryable; 4xx is a terminal error event."""
        body = (await response.aread()).decode(errors="replace")
        await response.aclose()
        if response.status_code >= 500:
            raise WorkerUnavailableError(
                f"worker {worker.worker_id} answered {response.status_code}: {body[:300]}"
            )
        code, message = error_fields(body, response.status_code)
        if response.status_code == 401:
            log.error("worker %s refused the internal token: check LORAHOST_INTERNAL_TOKEN", worker.worker_id)
        event = GenerateEvent(type="error", code=code, message=message)
        return WorkerStream(worker.worker_id, event, _NoEvents(), is_closed=True)

    async def start(
        self, route: RouteRequest, records: Sequence[WorkerRecord], request: GenerateRequest
    ) -> WorkerStream:
        """Route and start the request, retrying on another worker once; WorkerUnavailableError otherwise."""
        tried: set[str] = set()
        reasons: list[str] = []
        for _ in range(MAX_ATTEMPTS):
            worker = choose_worker(self.router, route, records, frozenset(tried), self.routed_since)
            if worker is None:
                break
            tried.add(worker.worker_id)
            try:
                return await self.open_counted(worker, route, request)
            except WorkerUnavailableError as exc:
                self._warn_unavailable(worker.worker_id, f"request {request.request_id}: {exc}")
                reasons.append(str(exc))
        if not tried:
            raise WorkerUnavailableError(f"no live worker serves base model {route.base_model!r}")
        raise WorkerUnavailableError("; ".join(reasons))

    def _warn_unavailable(self, worker_id: str, message: str) -> None:
        """Log a worker that could not start a request: a warning at most once per WARN_EVERY_S per worker
        (requests held through its outage retry it; each would log), the rest at debug level."""
        now = time.monotonic()
        if now - self._warned_at.get(worker_id, -WARN_EVERY_S) >= WARN_EVERY_S:
            if len(self._warned_at) >= MAX_CACHED_URLS:
                self._warned_at.clear()
            self._warned_at[worker_id] = now
            log.warning(
                "%s (further failures of this worker within %g s are logged at debug level)",
                message,
                WARN_EVERY_S,
            )
        else:
            log.debug("%s", message)

    async def open_counted(
        self, worker: WorkerRecord, route: RouteRequest, request: GenerateRequest
    ) -> WorkerStream:
        """`open` on a chosen worker, counted as routed there until the stream closes (the router's choice, or
        the worker of a request's first choice for its other choices: api/inference/choices.py)."""
        routed = self.routed_since.routed(worker, route)
        try:
            stream = await self.open(worker, request)
        except BaseException:
            self.routed_since.finished(routed)
            raise
        return self._counted_until_closed(stream, routed)

    def _counted_until_closed(self, stream: WorkerStream, routed: RoutedRequest) -> WorkerStream:
        """`stream`, leaving the routed count when it closes (at once if it is a refusal, already closed)."""
        if stream.is_closed:
            self.routed_since.finished(routed)
        else:
            stream.on_close = lambda: self.routed_since.finished(routed)
        return stream
