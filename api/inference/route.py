"""Routing a prepared request: wait through a cold start, pick a worker, open its stream, read the first event;
a request of n choices opens its other choices on the same worker then (api/inference/choices.py): a
non-streamed one before it returns, so that a sibling the worker refuses is still an HTTP error; a streamed
one while the response already streams choice 0 (its TTFT is choice 0's, not the slowest choice's), so a
sibling that cannot start ends the stream with an error chunk instead (api/inference/choice_streams.py).

The routing policy is services.router (settings.routing.policy, scheduler/routing/router.py), applied by the worker
client (api/worker_client.py), which retries once on another worker. While no worker of the base model is
ready, or every worker refuses as unavailable, the request waits (api/cold_start.py) and is then refused
with 503 + Retry-After; at once with a 503 when the base model's worker can never start (the embedded memory
budget, cluster/model_refusals.py). A request whose adapter rank is above every ready worker's `max_lora_rank` is refused
at once with a 400 naming the limit (`scheduler.routing.router.rank_limit_refusal`), and an adapter needing an engine feature
(DoRA, LoRA on embed_tokens / lm_head) when every ready worker of its base model runs an engine without it (vLLM)
with a 400 saying so (`engine_feature_refusal`). A worker that refuses the request before its first token becomes an HTTP error with
the status of its code (cluster.protocol.tenant_status: one status per code, on both sides).
"""

from __future__ import annotations

import logging
from functools import partial

import anyio
from starlette.types import Receive

from api.cold_start import ColdStartTimeout, ColdStartWait, ModelCannotStart
from api.errors import ApiError
from api.inference.choice_streams import ChoiceStreams, StreamOpener
from api.inference.choices import sibling_requests
from api.inference.prepare import Prepared
from api.live_workers import cached_live_workers, live_workers
from api.metering import UsageLedger
from api.request_meter import RequestMeter
from api.services import Services
from api.worker_client import WorkerClient, WorkerStream, WorkerUnavailableError
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateEvent, GenerateRequest, tenant_status
from cluster.worker_view import worker_view
from scheduler.routing.router import engine_feature_refusal, rank_limit_refusal

log = logging.getLogger(__name__)

RETRY_AFTER_NO_WORKER_S = 2
# The tenant-facing error type per status of a worker refusal (cluster.protocol.WORKER_ERROR_STATUS).
REFUSAL_ERROR_TYPE = {400: "invalid_request", 424: "adapter_unavailable"}
ADAPTER_UNAVAILABLE_ADVICE = (
    "; retrying will not help until the adapter version is fixed: upload a new version of the adapter, "
    "or ask the operator to check its stored files"
)


async def start(
    services: Services, prepared: Prepared, meter: RequestMeter, receive: Receive
) -> ChoiceStreams:
    """Route and open the worker streams of every choice, waiting through a cold start (api/cold_start.py):
    choice 0 is routed, the others open on its worker once it has started (api/inference/choices.py): before
    this returns, or, for a streamed response, once the response reads them. Worker refusals before this
    returns become HTTP errors (metered `error`; every stream is closed then); a streamed sibling that cannot
    start ends the stream with an error chunk (api/inference/respond.py)."""
    client = _worker_client(services)
    first, worker = await _open_when_ready(services, client, prepared, receive)
    meter.worker_id = first.worker_id
    streams = [first]
    has_siblings = prepared.num_sequences > 1 and first.first.type != "error"
    if has_siblings and prepared.is_stream:
        return ChoiceStreams(streams, openers=sibling_openers(client, worker, prepared))
    try:
        if has_siblings:
            streams += await _open_siblings(client, worker, prepared)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await ChoiceStreams(streams).aclose()
        if not isinstance(exc, WorkerUnavailableError):
            raise
        meter.is_prefilled = True  # choice 0 was prefilled
        await services.usage_ledger.record(meter, "error", f"choices not started: {exc}")
        raise ApiError(
            503,
            "unavailable",
            f"the worker serving this request could not start its other choices ({exc}); retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_NO_WORKER_S)},
        ) from exc
    choices = ChoiceStreams(streams)
    refused = next((s.first for s in streams if s.first.type == "error"), None)
    if refused is not None:
        meter.is_prefilled = meter.is_prefilled or refused is not first.first  # choice 0 was prefilled
        await choices.aclose()
        await record_worker_error(services.usage_ledger, meter, refused)
        raise refusal_error(refused)
    return choices


def sibling_openers(client: WorkerClient, worker: WorkerRecord, prepared: Prepared) -> list[StreamOpener]:
    """What opens each of choices 1..n-1 on `worker` (counted as routed there until its stream closes)."""
    return [
        partial(client.open_counted, worker, prepared.route, request)
        for request in sibling_requests(prepared.generate, prepared.num_sequences)
    ]


async def _open_siblings(
    client: WorkerClient, worker: WorkerRecord, prepared: Prepared
) -> list[WorkerStream]:
    """Open choices 1..n-1 on `worker` at once; WorkerUnavailableError (every opened one closed) if one
    cannot start."""
    requests = sibling_requests(prepared.generate, prepared.num_sequences)
    opened: dict[int, WorkerStream] = {}
    failures: list[WorkerUnavailableError] = []

    async def open_one(index: int, request: GenerateRequest) -> None:
        try:
            opened[index] = await client.open_counted(worker, prepared.route, request)
        except WorkerUnavailableError as exc:
            failures.append(exc)

    try:
        async with anyio.create_task_group() as group:
            for index, request in enumerate(requests):
                group.start_soon(open_one, index, request)
        if failures:
            raise failures[0]
    except BaseException:
        with anyio.CancelScope(shield=True):
            await ChoiceStreams(list(opened.values())).aclose()
        raise
    return [opened[index] for index in range(len(requests))]


async def _open_when_ready(
    services: Services, client: WorkerClient, prepared: Prepared, receive: Receive
) -> tuple[WorkerStream, WorkerRecord]:
    """The first worker stream that starts and its worker, waiting while none is ready; 503 past the
    cold-start deadline."""
    wait = ColdStartWait(services.settings, prepared.route.base_model, receive, services.metrics)
    try:
        while True:
            records = await wait.ready_records(
                lambda: live_records(services), lambda: services.model_refusals.get(prepared.route.base_model)
            )
            views = [worker_view(r) for r in records]
            refusal = rank_limit_refusal(prepared.route, views) or engine_feature_refusal(
                prepared.route, views
            )
            if (
                refusal is not None
            ):  # waiting would not help: no live worker's engine takes this rank or feature
                raise ApiError(400, "invalid_request", refusal)
            try:
                stream = await client.start(prepared.route, records, prepared.generate)
            except WorkerUnavailableError as exc:
                if not wait.has_waited:  # once per request: thousands may wait through one outage
                    log.info("request %s waits for a worker: %s", prepared.generate.request_id, exc)
                await wait.pause(str(exc))
                continue
            return stream, next(r for r in records if r.worker_id == stream.worker_id)
    except ModelCannotStart as exc:  # the same status as a worker that does not start in time, no Retry-After
        raise ApiError(503, "unavailable", str(exc)) from exc
    except ColdStartTimeout as exc:
        raise ApiError(
            503,
            "unavailable",
            f"{exc}; retry shortly (workers are starting or busy)",
            headers={"Retry-After": str(RETRY_AFTER_NO_WORKER_S)},
        ) from exc
    finally:
        wait.observe()


def _worker_client(services: Services) -> WorkerClient:
    client = services.worker_client
    if client is None:  # set by the app lifespan (api/main.py) or by whoever built the services
        raise RuntimeError("services.worker_client is not set: serve the API through api.main.create_app")
    return client


def refusal_error(event: GenerateEvent) -> ApiError:
    """The tenant's error for a worker's `error` event before any token (status: cluster.protocol)."""
    status = tenant_status(event.code)
    message = f"the worker refused the request ({event.code}): {event.message}"
    if event.code == "adapter_unavailable":
        message += ADAPTER_UNAVAILABLE_ADVICE
    return ApiError(
        status,
        REFUSAL_ERROR_TYPE.get(status, "worker_error"),
        message,
        headers={"Retry-After": str(RETRY_AFTER_NO_WORKER_S)} if status == 503 else None,
    )


async def live_records(services: Services) -> list[WorkerRecord]:
    """The live worker records: from the in-process directory or the fresh cached listing inline, else the
    shared (Redis) directory read in a thread (a network call)."""
    records = cached_live_workers(services.worker_directory, services.worker_listing)
    if records is not None:
        return records
    return await anyio.to_thread.run_sync(live_workers, services.worker_directory, services.worker_listing)


async def record_worker_error(ledger: UsageLedger, meter: RequestMeter, event: GenerateEvent) -> None:
    """Meter a worker refusal as `error` (prompt tokens billed only if the worker reports a prefill)."""
    if event.num_prompt_tokens:
        meter.is_prefilled = True
    await ledger.record(meter, "error", f"{event.code}: {event.message}")
