"""What a worker does per call, without HTTP or the blob store: request streams and the worker's stats.

`WorkerService` wraps one `InferenceBackend` and one `HostAdapterCache` (whose fetch function the server
injects) through an `AdapterManager` (gpu_workers/worker/adapter_manager.py: the host tier of adapter files,
leased per request). The engine core (scheduler/core/) owns device memory, plans each adapter's copy to the
device before its request's first step and decides what is evicted (idle adapters LRU-first). A request
whose adapter does not fit right now waits in the engine's queue: no count cap, no `overloaded` refusal
for adapter room. Everything here runs on the worker's event loop; blocking work goes to threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, cast

from cluster.membership import WorkerRecord
from cluster.protocol import (
    GenerateEvent,
    GenerateRequest,
    SamplingSpec,
    StructuredOutputSpec,
    TokenLogprobs,
    WorkerStats,
    prefix_cache_namespace,
)
from cluster.worker_stats import WorkerState, build_worker_stats
from gpu_workers.engine.errors import AdapterLoadFailedError, AdapterNotLoadedError, PromptTooLongError
from gpu_workers.engine.outputs import RequestOutput
from gpu_workers.worker.adapter_manager import AdapterManager
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.host_cache import HostAdapterCache
from gpu_workers.worker.worker_errors import BadRequestError, DrainingError
from scheduler.core.engine_request import EngineRequest, prompt_size_error
from scheduler.core.engine_stats import EngineStats
from scheduler.core.sampling import SamplingParams, TokenLogprob
from scheduler.core.structured_output import StructuredOutput


class WorkerService:
    """One worker's behaviour: prepare (everything checkable up front), then stream events."""

    def __init__(
        self,
        engine: InferenceBackend,
        host_cache: HostAdapterCache,
        *,
        worker_id: str,
        base_model: str,
        max_num_seqs: int,
        perf_model: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.perf_model = (
            perf_model  # the profile published in heartbeats (scheduler.routing.perf_model.PerfModel.to_dict)
        )
        self.host_cache = host_cache
        self.worker_id = worker_id
        self.base_model = base_model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = engine.engine_stats().max_model_len
        self.adapters = AdapterManager(engine, host_cache)
        self.is_ready = True
        self.is_draining = False
        self._active: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- generate -----------------------------------------------------------------------------------

    async def prepare(self, request: GenerateRequest, received_at: float | None = None) -> EngineRequest:
        """Check and admit a request (draining, sampling, prompt, adapter); raises a WorkerError subclass.

        Builds the one `EngineRequest` the backend receives (the adapter's engine id is the wire's
        `AdapterRef.adapter_key`), holding the adapter's lease until `finish`."""
        received_at = time.time() if received_at is None else received_at
        if self.is_draining:
            raise DrainingError(f"worker {self.worker_id} is draining; send the request to another worker")
        if request.request_id in self._active:
            raise BadRequestError(f"request id {request.request_id!r} is already running on this worker")
        params = sampling_params_from_spec(request.sampling)
        token_ids = self._prompt_token_ids(request)
        adapter_id = await self.adapters.acquire(request.adapter) if request.adapter else None
        self._active.add(request.request_id)
        self._idle.clear()
        return EngineRequest(
            request.request_id,
            token_ids,
            params,
            adapter_id,
            predicted_output_tokens=request.predicted_output_tokens,
            tenant_id=request.tenant_id,
            tenant_weight=request.tenant_weight,
            cache_namespace=request.cache_namespace or prefix_cache_namespace(request.tenant_id),
            received_at=received_at,
        )

    def _prompt_token_ids(self, request: GenerateRequest) -> tuple[int, ...]:
        """The prompt's token ids (a text prompt tokenized here), within this engine's max_model_len."""
        if (request.prompt is None) == (request.prompt_token_ids is None):
            raise BadRequestError("send exactly one of prompt and prompt_token_ids")
        if request.prompt is not None:
            token_ids = tuple(self.engine.tokenizer.encode(request.prompt))  # type: ignore[attr-defined]
        else:
            token_ids = tuple(int(t) for t in request.prompt_token_ids or ())
        size_error = prompt_size_error(len(token_ids), self.max_model_len)
        if size_error is not None:
            raise BadRequestError(size_error)
        return token_ids

    async def stream(self, prepared: EngineRequest) -> AsyncIterator[GenerateEvent]:
        """Deltas, then one final or error event. Closing the iterator early aborts the engine request."""
        last: RequestOutput | None = None
        stream = cast(  # backends return async generators: aclose() aborts the engine request
            AsyncGenerator[RequestOutput, None],
            self.engine.generate_stream(prepared),
        )
        try:
            async with aclosing(stream):  # closing this iterator early closes the engine stream
                async for out in stream:
                    last = out
                    if out.new_token_ids or out.new_text:
                        yield delta_event(out)
            yield final_event(last, prepared.received_at) if last else error_event("internal", "no output")
        except (AdapterNotLoadedError, AdapterLoadFailedError) as exc:  # its planned copy failed
            yield error_event("adapter_unavailable", str(exc))
        except (PromptTooLongError, ValueError) as exc:  # NumericOverflowError too: the tenant's adapter
            yield error_event("bad_request", str(exc))
        except Exception as exc:  # noqa: BLE001 (an engine failure ends this stream, not the worker)
            yield error_event("internal", f"engine error: {type(exc).__name__}: {exc}")
        finally:
            self.finish(prepared)

    def finish(self, prepared: EngineRequest) -> None:
        """Release a prepared request's adapter lease and slot (idempotent)."""
        if prepared.request_id not in self._active:
            return
        self._active.discard(prepared.request_id)
        if prepared.adapter_id is not None:
            self.adapters.release(prepared.adapter_id)
        if not self._active:
            self._idle.set()

    # ---- lifecycle ----------------------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        """Requests admitted and not yet finished (streams open)."""
        return len(self._active)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for running ones; True if all finished within timeout_s."""
        self.is_draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    # ---- introspection ------------------------------------------------------------------------------

    async def engine_stats(self) -> EngineStats:
        """The engine's stats, read off the event loop (it waits for the current step)."""
        return await asyncio.to_thread(self.engine.engine_stats)

    def stats(self, engine_stats: EngineStats | None = None) -> WorkerStats:
        """Load, residency and counters as WorkerStats (pass `await engine_stats()` to avoid blocking the loop).

        The engine's typed stats and the worker's own state (its identity, host cache, leases and adapter
        counters, the ranks the API sent for host-cached adapters, its profile) through the one conversion
        `cluster.worker_stats.build_worker_stats`.
        """
        engine_stats = self.engine.engine_stats() if engine_stats is None else engine_stats
        device = self.adapters.device_adapters(engine_stats)
        counters = self.adapters.counters
        worker = WorkerState(
            worker_id=self.worker_id,
            base_model=self.base_model,
            max_num_seqs=self.max_num_seqs,
            host_adapters=self.adapters.host_adapters(device),
            known_ranks=self.adapters.known_ranks(),
            num_active=self.num_active,
            num_cache_hits=counters.num_cache_hits,
            num_cache_misses=counters.num_cache_misses,
            num_adapter_unloads=counters.num_adapter_unloads,
            num_load_failures=counters.num_load_failures,
            perf_model=self.perf_model,
            is_ready=self.is_ready,
            is_draining=self.is_draining,
        )
        return build_worker_stats(engine_stats, worker)

    def record(self, url: str, engine_stats: EngineStats | None = None) -> WorkerRecord:
        """The membership record advertised in heartbeats: these stats plus the worker's URL."""
        return WorkerRecord.from_stats(self.stats(engine_stats), url)


def sampling_params_from_spec(spec: SamplingSpec) -> SamplingParams:
    """Engine SamplingParams from the wire spec (top_k -1 means disabled); BadRequestError if invalid."""
    try:
        return SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=max(spec.top_k, 0),
            seed=spec.seed,
            stop=tuple(spec.stop),
            stop_token_ids=tuple(spec.stop_token_ids),
            ignore_eos=spec.ignore_eos,
            min_tokens=spec.min_tokens,
            presence_penalty=spec.presence_penalty,
            frequency_penalty=spec.frequency_penalty,
            repetition_penalty=spec.repetition_penalty,
            logit_bias=tuple(spec.logit_bias.items()),
            logprobs=spec.logprobs,
            needs_cumulative_logprob=spec.needs_cumulative_logprob,
            prompt_logprobs=spec.prompt_logprobs,
            structured_output=structured_output_from_spec(spec.structured_output),
        )
    except ValueError as exc:
        raise BadRequestError(f"invalid sampling parameters: {exc}") from exc


def wire_logprob(logprob: TokenLogprob) -> TokenLogprobs:
    """The engine's TokenLogprob as wire events carry it."""
    return TokenLogprobs(token_id=logprob.token_id, logprob=logprob.logprob, top=list(logprob.top))


def delta_event(out: RequestOutput) -> GenerateEvent:
    """The delta event of an engine output: its tokens and text, with their logprobs (and the prompt's, on
    the first delta) when the request asked for them."""
    prompt = out.prompt_logprobs
    return GenerateEvent(
        type="delta",
        text=out.new_text,
        token_ids=list(out.new_token_ids),
        logprobs=None if out.new_logprobs is None else [wire_logprob(lp) for lp in out.new_logprobs],
        prompt_logprobs=None
        if prompt is None
        else [None if lp is None else wire_logprob(lp) for lp in prompt],
    )


def structured_output_from_spec(spec: StructuredOutputSpec | None) -> StructuredOutput | None:
    """The engine's output constraint from the wire's (ValueError when it is malformed)."""
    return None if spec is None else StructuredOutput(spec.kind, spec.spec)


def final_event(last: RequestOutput, received_at: float | None) -> GenerateEvent:
    """The terminal event with token counts, timings (ms, measured from the worker's receipt; from the
    engine's arrival when there was none) and the cumulative logprob when the request asked for it."""
    received_at = last.arrival_time if received_at is None else received_at
    finished = last.finish_time or time.time()
    first = last.first_token_time
    num_output = last.num_output_tokens
    tpot_ms = (finished - first) * 1000 / (num_output - 1) if first is not None and num_output > 1 else None
    return GenerateEvent(
        type="final",
        finish_reason=last.finish_reason,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=num_output,
        ttft_ms=(first - received_at) * 1000 if first is not None else None,
        tpot_ms=tpot_ms,
        e2e_ms=(finished - received_at) * 1000,
        queue_ms=max(0.0, last.arrival_time - received_at) * 1000,
        cumulative_logprob=last.cumulative_logprob,
    )


def error_event(code: str, message: str) -> GenerateEvent:
    """A terminal error event."""
    return GenerateEvent(type="error", code=code, message=message)
