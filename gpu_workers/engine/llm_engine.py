"""LLMEngine: add_request / step / abort over the torch-free engine core (scheduler/core/) and the model
runner (single-threaded; see async_engine.py for the thread-safe streaming wrapper).

Each step the core's `BatchScheduler.schedule()` returns a `StepPlan`; the engine carries it out: its
`AdapterPlacer` (gpu_workers/engine/adapter_placer.py) drops the evicted adapters' device copies and starts the
planned adapter copies (asynchronous, gpu_workers/engine/adapter_copier.py), then the engine runs the entries
(those of a still-copying adapter as CPU-assisted prefills, layers/host_lora.py). Finished copies are
polled at step start, between layers (the runner switches to a landed device copy) and after the forward.
The page pool is the one owner of device memory: KV blocks and adapter pages come from
it, and it alone decides how many adapters are on the device (there is no count cap). A request whose
adapter does not fit right now waits in the queue; a copy that fails ends that adapter's requests with
error_code "adapter_unavailable". With prefix caching, the core's `PrefixCache` owns the pages of cached
prompt blocks; a request starting from cached blocks only computes the rest of its prompt (the model runner
reads the block table as usual).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_workers.engine.adapter_placer import AdapterPlacer, CopyFailure
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.detokenizer import append_text, find_stop_string, num_held_back_chars
from gpu_workers.engine.engine_stats import EngineCounters, engine_stats
from gpu_workers.engine.errors import (
    AdapterInUseError,
    AdapterNotLoadedError,
    DuplicateRequestError,
    PromptTooLongError,
)
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.model_runner import ModelRunner
from gpu_workers.engine.outputs import CompletionOutput, RequestOutput
from registry.validation import AdapterInfo
from scheduler.admission import BatchPolicy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import Sequence
from scheduler.core.step_plan import StepPlan
from scheduler.eviction import make_eviction_policy


class LLMEngine:
    """Native multi-LoRA engine: continuous batching, paged KV, per-adapter segmented LoRA."""

    def __init__(
        self,
        config: EngineConfig,
        policy: BatchPolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: the one clock of the engine, its scheduler and its residency (request times, policy and
        eviction ages); wall-clock seconds by default, the times reported to users and metering."""
        from transformers import AutoTokenizer

        self.config = config
        self.clock = clock
        self.runner = ModelRunner(config)
        self.tokenizer = AutoTokenizer.from_pretrained(str(config.model_path))
        self.max_model_len = self.runner.max_model_len
        num_kv_pages = self.runner.num_kv_blocks
        self.pool = PagePool(num_kv_pages + self.runner.num_adapter_pages(), config.block_size, num_kv_pages)
        self.residency = AdapterResidency(
            self.pool,
            self.runner.kv_bytes_per_block(),
            policy=make_eviction_policy(config.adapter_eviction_policy),
            clock=clock,
            is_caching_idle_adapters=config.is_caching_idle_adapters,
        )
        self.prefix_cache = PrefixCache(self.pool) if config.enable_prefix_caching else None
        self.eos_token_ids = frozenset(self.runner.args.eos_token_ids) | (
            {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        )
        self.scheduler = BatchScheduler(
            self.pool,
            self.residency,
            policy or config.admission_policy(),
            config.max_num_seqs,
            config.max_num_batched_tokens,
            prefix_cache=self.prefix_cache,
            num_cpu_prefill_workers=config.cpu_prefill_workers,
            clock=clock,
            eos_token_ids=self.eos_token_ids,
            max_running_tokens=config.max_running_tokens,
        )
        self.counters = EngineCounters()
        self.placer = AdapterPlacer(self.runner, self.scheduler, self.counters)
        self._pending_outputs: list[RequestOutput] = []
        self._request_counter = itertools.count()

    # ---- requests -----------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        sampling_params: SamplingParams,
        adapter_id: str | None = None,
        arrival_time: float | None = None,
        adapter_path: Path | str | None = None,
        predicted_output_tokens: int | None = None,
        *,
        tenant_id: str | None = None,
        tenant_weight: float = 1.0,
        cache_namespace: str | None = None,
    ) -> None:
        """Queue a request; raises PromptTooLongError, AdapterNotLoadedError or DuplicateRequestError.

        The adapter may be only on the host: pass `adapter_path` (or register it first); the core plans
        its copy to the device before the request's first step. `predicted_output_tokens` (default
        max_tokens) is what the batch policy sees as the expected output length. `tenant_id` is who sent it,
        `tenant_weight` its tenant's fair-share weight and `cache_namespace` the prefix-cache namespace its
        blocks are shared in (see `Sequence`).
        """
        if self.scheduler.get(request_id) is not None:
            raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
        if adapter_id is not None and adapter_path is not None and self.residency.get(adapter_id) is None:
            self.register_adapter(adapter_id, adapter_path)
        if adapter_id is not None and self.residency.residency(adapter_id) is Residency.NONE:
            raise AdapterNotLoadedError(
                f"adapter {adapter_id!r} is not loaded; call load_adapter or register_adapter first"
            )
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("prompt is empty; send at least one token")
        if len(token_ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}; "
                f"shorten it to at most {self.max_model_len - 1} tokens"
            )
        max_tokens = min(sampling_params.max_tokens, self.max_model_len - len(token_ids))
        seq = Sequence(
            request_id,
            token_ids,
            sampling_params,
            adapter_id,
            max_tokens,
            predicted_output_tokens,
            tenant_id=tenant_id,
            tenant_weight=tenant_weight,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            cache_namespace=cache_namespace,
        )
        self.scheduler.add(seq)
        self.counters.num_prompt_tokens += len(token_ids)

    def abort(self, request_id: str) -> bool:
        """Finish a request now (reason "abort"), freeing its pages; False if it is not in the engine."""
        seq = self.scheduler.get(request_id)
        if seq is None:
            return False
        self._finish(seq, "abort")
        self.counters.num_aborted += 1
        self._pending_outputs.append(self._delta(seq, []))
        return True

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return self.scheduler.has_unfinished()

    # ---- stepping -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; return a delta for every request that produced a token, finished or was aborted."""
        self._fail_adapters(self.placer.poll_copies())
        plan = self.scheduler.schedule()
        self._fail_adapters(self.placer.carry_out(plan))
        entries = plan.runnable_entries()  # a failed adapter load ends its requests
        if not entries:
            if plan.copy_waits and self.runner.transfers.copier.has_in_flight():
                self.runner.transfers.copier.wait_any(
                    _COPY_WAIT_SECONDS
                )  # nothing else to run: let the copy land
                self._fail_adapters(self.placer.poll_copies())
            outputs, self._pending_outputs = self._pending_outputs, []
            return outputs
        started = time.perf_counter()
        host_assisted = plan.host_assisted_adapters & {e.seq.adapter_id for e in entries}
        if host_assisted:
            tokens, _ = self.runner.execute(entries, host_assisted=host_assisted)
        else:
            tokens, _ = self.runner.execute(entries)
        outputs, self._pending_outputs = self._pending_outputs, []
        outputs.extend(self._process(plan, tokens))
        num_sampled = sum(t is not None for t in tokens)
        self.counters.record_step(entries, num_sampled, time.perf_counter() - started)
        self._fail_adapters(self.placer.poll_copies())
        outputs, self._pending_outputs = outputs + self._pending_outputs, []
        return outputs

    def _process(self, plan: StepPlan, tokens: list[int | None]) -> list[RequestOutput]:
        """Hand the sampled tokens to the core (stops, times), fail the rows without a token, build deltas."""
        update = self.scheduler.update_from_output(plan, tokens, self.clock(), text_stop=self._is_stop_string)
        for seq in update.finished:
            self._release(seq)
        outputs = []
        for row in update.sampled:
            if row.token_id is None:
                self._fail(row.seq, _overflow_message(row.seq), "numeric_overflow")
                outputs.append(self._delta(row.seq, []))
            else:
                outputs.append(self._delta(row.seq, [row.token_id]))
        return outputs

    def _is_stop_string(self, seq: Sequence) -> bool:
        """Detokenize seq's new token; True (text trimmed before it) when the text now holds a stop string."""
        num_chars_before = len(seq.output_text)
        append_text(self.tokenizer, seq)
        stop = seq.sampling_params.stop
        stop_at = find_stop_string(seq.output_text, stop, len(seq.output_text) - num_chars_before)
        if stop_at is None:
            return False
        seq.output_text = seq.output_text[:stop_at]
        return True

    def _fail(self, seq: Sequence, error: str, code: str) -> None:
        """Finish one request with reason "error" and an error code (its batch neighbours are not affected)."""
        seq.error, seq.error_code = error, code
        self._finish(seq, "error")

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_time = self.clock()
        self.scheduler.finish(seq, reason)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """A finished sequence leaves the runner (its per-request state) and is counted."""
        self.runner.release_request(seq.request_id)
        self.counters.num_finished += 1

    def _delta(self, seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
        """Build the output delta; text that could still become a stop string is held back until finish."""
        visible = len(seq.output_text)
        if not seq.is_finished:
            visible = max(seq.num_emitted_chars, visible - num_held_back_chars(seq.sampling_params.stop))
        new_text = seq.output_text[seq.num_emitted_chars : visible]
        seq.num_emitted_chars = visible
        return RequestOutput.of(seq, new_token_ids, new_text)

    # ---- offline convenience -------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams],
        adapter_ids: list[str | None] | None = None,
    ) -> list[CompletionOutput]:
        """Run prompts to completion (continuous batching) and return one CompletionOutput per prompt, in order."""
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        adapters = adapter_ids if adapter_ids is not None else [None] * len(prompts)
        if not len(params) == len(adapters) == len(prompts):
            raise ValueError("prompts, sampling_params and adapter_ids must have the same length")
        ids = [f"generate-{next(self._request_counter)}" for _ in prompts]
        seqs: dict[str, Sequence] = {}
        prompt_list: list[str | list[int]] = list(prompts)
        for request_id, prompt, p, adapter_id in zip(ids, prompt_list, params, adapters):
            self.add_request(request_id, prompt, p, adapter_id)
            seqs[request_id] = self.scheduler.get(request_id)  # type: ignore[assignment]
        while any(not s.is_finished for s in seqs.values()):
            self.step()
        return [CompletionOutput.of(seqs[i]) for i in ids]

    # ---- adapters -----------------------------------------------------------------------------------

    def inspect_adapter(self, path: Path | str) -> AdapterInfo:
        """Validate an adapter directory against this engine (reads files only; safe beside step())."""
        return self.runner.transfers.validate_adapter(Path(path))

    def register_adapter(self, adapter_id: str, path: Path | str, info: AdapterInfo | None = None) -> None:
        """Validate an adapter's host copy and make it known to the core (host tier; nothing on the device).

        `info` is the result of `inspect_adapter(path)` when the caller validated off the engine lock.
        Raises AdapterLoadError when the files are invalid or the adapter can never fit the page pool.
        """
        info = self.inspect_adapter(path) if info is None else info
        num_bytes = self.runner.adapter_device_bytes(info)
        self.placer.register(
            adapter_id, str(path), info.rank, num_bytes, self.runner.transfers.adapter_num_pages(info)
        )

    def load_adapter(self, adapter_id: str, path: Path | str, info: AdapterInfo | None = None) -> None:
        """Validate and put (or reload) an adapter on the device now, through the core's plan (`info` as
        in register_adapter).

        The pool approves first (idle adapters may be evicted), then the device tensors are built; a build
        that fails cancels the load (AdapterLoadError, the adapter stays on the host). Raises
        AdapterInUseError when reloading one that requests use and AdapterCapacityError when the adapters
        that would have to go are in use.
        """
        info = self.inspect_adapter(path) if info is None else info
        transfers = self.runner.transfers
        self.placer.place(
            adapter_id,
            str(path),
            info.rank,
            self.runner.adapter_device_bytes(info),
            transfers.adapter_num_pages(info),
            lambda: transfers.load_adapter(adapter_id, Path(path), info),
        )

    def prepare_adapter(self, adapter_id: str, path: Path | str) -> LoraAdapter:
        """Validate and pack an adapter's device tensors without touching engine state."""
        info = self.runner.transfers.validate_adapter(Path(path))
        return self.runner.transfers.load_adapter(adapter_id, Path(path), info)

    def install_adapter(
        self, adapter: LoraAdapter, path: Path | str | None = None, load_seconds: float | None = None
    ) -> None:
        """Put an adapter whose tensors the caller built on the device, through the core's plan (idle
        adapters may be evicted); same errors as load_adapter. `load_seconds`: how long building it took
        (the reload cost the eviction policy weighs)."""
        host_path = str(path) if path is not None else None
        self.placer.place(
            adapter.adapter_id,
            host_path,
            adapter.rank,
            adapter.num_bytes,
            self.runner.transfers.num_pages_of(adapter),
            lambda: adapter,
            load_seconds,
        )

    def unload_adapter(self, adapter_id: str) -> None:
        """Drop an adapter; raises AdapterInUseError if requests use it, AdapterNotLoadedError if unknown."""
        if adapter_id not in self.runner.adapters:
            raise AdapterNotLoadedError(f"adapter {adapter_id!r} is not loaded")
        if self.scheduler.is_adapter_in_use(adapter_id):
            raise AdapterInUseError(
                f"adapter {adapter_id!r} is used by running or waiting requests; unload it after they finish"
            )
        self.residency.forget(adapter_id)
        self.placer.drop_device_copy(adapter_id)
        self.runner.transfers.forget_host_copies(adapter_id)

    def pin_adapter(self, adapter_id: str) -> None:
        """Lease a registered adapter (e.g. a worker request not yet in the engine): kept on the device
        unless a request ahead needs the room; AdapterNotLoadedError when unknown."""
        if self.residency.get(adapter_id) is None:
            raise AdapterNotLoadedError(f"adapter {adapter_id!r} is not loaded")
        self.residency.pin(adapter_id)

    def unpin_adapter(self, adapter_id: str) -> None:
        """End a lease taken with pin_adapter."""
        self.residency.unpin(adapter_id)

    def adapter_residency(self, adapter_id: str) -> str:
        """ "none", "host", "copying" or "device"."""
        return self.residency.residency(adapter_id).value

    def loaded_adapters(self) -> list[str]:
        """Ids of the adapters on the device."""
        return sorted(self.runner.adapters)

    def device_adapters(self) -> list[str]:
        """Ids of the adapters on the device (or being copied), least recently used first."""
        return self.residency.device_adapters()

    def _fail_adapters(self, failures: list[CopyFailure]) -> None:
        """Planned copies failed (files changed or vanished after they were verified, or the link failed):
        end those adapters' requests only, with error_code "adapter_unavailable"."""
        for adapter_id, reason in failures:
            self.counters.num_adapter_copy_failures += 1
            self.counters.num_adapter_load_failures += 1
            for seq in self.scheduler.on_adapter_load_failed(adapter_id):
                message = f"adapter {adapter_id!r} could not be loaded from its host copy: {reason}"
                self._fail(seq, message, "adapter_unavailable")
                self._pending_outputs.append(self._delta(seq, []))

    # ---- introspection ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counts, KV usage, adapter cache counters and step timings (plain JSON-able values; see
        gpu_workers/engine/engine_stats.py)."""
        return engine_stats(self)


_COPY_WAIT_SECONDS = 0.005  # longest an idle step blocks on an adapter copy (new requests wait that long)


def _overflow_message(seq: Sequence) -> str:
    """What a tenant reads when its request's logits went non-finite."""
    if seq.adapter_id is None:
        return (
            f"request {seq.request_id!r} was stopped: the base model produced non-finite logits (numeric "
            "overflow) for this prompt; shorten or change the prompt"
        )
    return (
        f"request {seq.request_id!r} was stopped: adapter {seq.adapter_id!r} produced non-finite logits "
        "(numeric overflow in its weights); retrain or rescale it with smaller lora_B/lora_A values or a "
        "smaller lora_alpha, upload it again, and retry"
    )
